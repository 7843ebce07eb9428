"""A full disk, for real: commands writing an index on a 2 MiB tmpfs print one line (the path,
the free space, the space needed when known) and exit 1, and the index keeps its last commit.

Mounting needs root (or CAP_SYS_ADMIN); without it the tests are skipped with the reason.
"""
from __future__ import annotations

import errno
import shutil
import subprocess
from pathlib import Path

import pytest

from colgraph_engine.cli import main as colgraph
from colgraph_engine.cli.common import disk_full_message
from colgraph_engine.kg import Encoders, KnowledgeIndex

WORDS = ("Zermatt Matterhorn Basel Rhine Danube Vienna Budapest Kyoto Temple Glacier Express Moritz Lisbon "
         "Tagus Apollo Moon Armstrong Aldrin Cologne Rotterdam").split()


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)],
                              capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("no mount command to make a small tmpfs")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a 2 MiB tmpfs (needs root): {done.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def big_text(path: Path, words: int = 40_000) -> None:
    """Text whose vectors take several MiB (offline encoders: 512 B per token, ~1,200 tokens per segment)."""
    path.write_text(" ".join(f"{WORDS[i % len(WORDS)]}{i % 997}" for i in range(words)) + "\n")


def one_line_error(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_build_and_add_on_a_full_disk_say_so_in_one_line_and_keep_the_index(small_disk, tmp_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "good.md").write_text("# Good\n\nThe Matterhorn stands above Zermatt.\n")
    out = small_disk / "ix"
    assert colgraph(["index", "build", "--encoders", "hashing", str(docs), "--out", str(out), "--no-isolate"]) == 0
    capsys.readouterr()
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    big = tmp_path / "big.txt"
    big_text(big)
    for flags in (["--no-isolate"], []):  # in this process, and with the worker (the parent commits)
        assert colgraph(["index", "add", str(out), str(big), "--json", *flags]) == 1
        line = one_line_error(capsys.readouterr().err)
        assert line.startswith("colgraph index add: no space left on device writing ")
        assert str(small_disk) in line and "free of 2.0 MiB" in line
        assert "this commit needs at least" in line and "MiB for its vectors alone" in line
        # the index is the one committed before: same files, same documents, every checksum good
        assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == before
        assert KnowledgeIndex.open(out, Encoders.offline(), verify=True).documents == ["good.md"]
    assert colgraph(["index", "verify", str(out)]) == 0
    capsys.readouterr()
    # a new index: good.md's commit fits, the big file's does not and is not kept
    shutil.rmtree(out)
    (docs / "z_big.txt").write_text(big.read_text())
    assert colgraph(["index", "build", "--encoders", "hashing", str(docs), "--out", str(small_disk / "ix2"), "--no-isolate",
                     "--batch-size", "1", "--json"]) == 1
    line = one_line_error(capsys.readouterr().err)
    assert line.startswith("colgraph index build: no space left on device writing ")
    assert KnowledgeIndex.open(small_disk / "ix2", Encoders.offline(), verify=True).documents == ["good.md"]


def test_remove_and_demo_on_a_disk_with_no_byte_left(small_disk, tmp_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in ("a.md", "b.md"):
        (docs / name).write_text(f"# {name}\n\nThe Rhine flows past Basel and Cologne.\n")
    out = small_disk / "ix"
    assert colgraph(["index", "build", "--encoders", "hashing", str(docs), "--out", str(out), "--no-isolate", "--batch-size", "1"]) == 0
    capsys.readouterr()
    filler = small_disk / "filler"
    with open(filler, "wb", buffering=0) as f:  # take every remaining block
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    assert colgraph(["index", "remove", str(out), "a.md"]) == 1
    line = one_line_error(capsys.readouterr().err)
    assert line.startswith("colgraph index remove: no space left on device writing ") and "0 bytes free" in line
    assert sorted(KnowledgeIndex.open(out, Encoders.offline(), verify=True).documents) == ["a.md", "b.md"]
    assert colgraph(["demo", "--out", str(small_disk / "demo")]) == 1
    line = one_line_error(capsys.readouterr().err)
    assert line.startswith("colgraph demo: no space left on device writing ")
    filler.unlink()
    assert colgraph(["index", "remove", str(out), "a.md"]) == 0
    assert KnowledgeIndex.open(out, Encoders.offline()).documents == ["b.md"]


def test_the_message_names_a_quota_and_a_path_that_does_not_exist_yet(tmp_path):
    exc = OSError(errno.EDQUOT, "Disk quota exceeded", str(tmp_path / "ix" / "part-1" / "x.bin"))
    exc.needed_bytes = 3 * 2**20
    line = disk_full_message(exc, tmp_path / "ix")
    assert line.startswith(f"disk quota exceeded writing {tmp_path / 'ix' / 'part-1' / 'x.bin'}: ")
    assert f"on the file system of {tmp_path}" in line and "needs at least 3.0 MiB" in line
