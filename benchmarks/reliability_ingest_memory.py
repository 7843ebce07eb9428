"""Reproducer for issue 22, items 2 and 3: peak memory of ``colgraph index build`` on one file.

    python benchmarks/reliability_ingest_memory.py [--cases bomb1,bomb3,blank200,...] [--pythonpath DIR]

Each case writes one file into a fresh folder and runs ``python -m colgraph_engine index build
FOLDER --out IDX`` as a child process (offline encoders, the defaults otherwise). The row holds
its wall seconds, its peak RSS (``ru_maxrss`` of ``RUSAGE_CHILDREN``, read in a helper process
whose only child is the CLI, so it is the largest of the CLI and its own workers), the exit
status, and how many ``colgraph-images-*`` folders the run left in its temporary folder (the
child's TMPDIR is a fresh folder, so anything left there is a leak). Cases:

* ``bomb1`` / ``bomb3``: a hand-written PDF of 1 or 3 empty pages whose MediaBox is
  14400 x 14400 pt (200 x 200 inches; 350 bytes for one page);
* ``blank200`` / ``blank800``: blank US-letter pages made with pypdfium2;
* ``blank10000_nopages``: 10,000 blank pages with ``--no-page-images`` (and, on the current
  CLI, ``--max-pages 0``: it reads only the first 5,000 pages of a PDF by default);
* ``md50``: a 50 MB Markdown file that is one line of words;
* ``*_noisolate``: the same with ``--no-isolate`` (files processed in the CLI's own process
  rather than in its per-file worker; the "before" CLI had no worker).

``--pythonpath DIR`` runs the CLI from another checkout for the "before" rows (through
``_harness.checkout_env``): ``git worktree add --detach /tmp/before HEAD`` and copy the built
``colgraph_engine/_core*.so`` into it (from the venv's ``site-packages/colgraph_engine``), else the
native module is absent there. Prints one
JSON object per case, then a JSON list of all of them.
"""
from __future__ import annotations

import argparse
import json
import random
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as h  # noqa: E402

CASES = ("bomb1", "bomb3", "blank200", "blank800", "blank10000_nopages", "md50")
# the same inputs with --no-isolate (after only: the CLI processes files in its own process,
# not in the per-file worker that the old CLI did not have)
NO_ISOLATE = ("blank800_noisolate", "md50_noisolate")


def one_line_markdown(path: Path, megabytes: float = 50.0, seed: int = 0) -> int:
    """`megabytes` MB of lower-case pseudo-words separated by spaces, on one line, no newline."""
    rng = random.Random(seed)
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
             for _ in range(5000)]
    with open(path, "w", encoding="ascii") as f:
        written = 0
        while written < megabytes * 1_000_000:
            written += f.write(" ".join(rng.choices(vocab, k=20000)) + " ")
    return path.stat().st_size


def make_case(name: str, folder: Path) -> tuple[Path, list[str]]:
    """The input file of case `name` in `folder` and the extra CLI arguments."""
    if name.endswith("_noisolate"):
        file, extra = make_case(name[: -len("_noisolate")], folder)
        return file, extra + ["--no-isolate"]
    if name.startswith("bomb"):  # the hand-written 14400 x 14400 pt page-size bomb of the tests
        from tests.test_ingest_bounded import bomb_pdf
        bomb_pdf(folder / "bomb.pdf", pages=int(name[4:]))
        return folder / "bomb.pdf", []
    if name.startswith("blank"):
        h.blank_pdf(folder / "blank.pdf", int(name[5:].split("_")[0]))
        return folder / "blank.pdf", (["--no-page-images"] if "_nopages" in name else [])
    if name == "md50":
        one_line_markdown(folder / "long.md", 50.0)
        return folder / "long.md", []
    raise ValueError(f"cases: unknown case {name!r}; known: {CASES + NO_ISOLATE}")


def run_case(name: str, pythonpath: str | None, timeout: float) -> dict:
    """One CLI build of case `name`; run in a helper process of its own (see :func:`main`)."""
    work = Path(tempfile.mkdtemp(prefix="ingest-mem-"))
    try:
        src, tmp = work / "in", work / "tmp"
        src.mkdir()
        tmp.mkdir()
        file, extra = make_case(name, src)
        if not pythonpath and name.startswith("blank10000"):
            extra = [*extra, "--max-pages", "0"]  # the CLI now stops at 5,000 pages by default
        cmd = [sys.executable, "-m", "colgraph_engine", "index", "build", str(src), "--out", str(work / "idx"),
               "--json", *extra]
        proc = subprocess.Popen(cmd, env=h.checkout_env(pythonpath, TMPDIR=str(tmp), OMP_NUM_THREADS="1"),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=work)

        def wait():
            try:
                return proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                return proc.communicate()
        (out, err), seconds = h.timed(wait)
        # RUSAGE_CHILDREN's ru_maxrss: the largest reaped child, here the CLI or one of its workers
        row = {"case": name, "file_bytes": file.stat().st_size, "seconds": round(seconds, 2),
               "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1),
               "rc": proc.returncode, "spool_dirs_left": len(list(tmp.glob("colgraph-images-*"))),
               "tmp_entries_left": len(list(tmp.iterdir()))}
        if proc.returncode != 0:
            row["stderr_tail"] = err.decode(errors="replace")[-400:]
            return row
        try:
            totals = json.loads(out)["totals"]
            row.update({k: totals.get(k) for k in ("added", "pages", "segments", "images")})
        except (ValueError, KeyError, TypeError):
            pass
        return row
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {CASES + NO_ISOLATE}")
    ap.add_argument("--pythonpath", default=None, help="checkout to run the CLI from (before rows)")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: run one case here
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_case(args.one, args.pythonpath, args.timeout)))
        return
    rows = []
    for name in args.cases.split(","):
        # one helper process per case, so that RUSAGE_CHILDREN's maximum is this case's child alone
        cmd = [sys.executable, __file__, "--one", name, "--timeout", str(args.timeout)]
        try:
            row = h.run_json(cmd + (["--pythonpath", args.pythonpath] if args.pythonpath else []))
        except h.ChildFailed as exc:
            row = {"case": name, "error": exc.stderr[-400:]}
        row["code"] = "before" if args.pythonpath else "after"
        print(json.dumps(row), flush=True)
        rows.append(row)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
