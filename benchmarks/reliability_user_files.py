"""Reproducer for issue 22 item 9: does writing an index into a folder that already holds a
user's files delete them? Prints one JSON object per case.

    python benchmarks/reliability_user_files.py

* create / save: a folder with ``parts/chapter1.txt`` and ``vectors/emb.bin``; the index is
  created (saved) there without ``overwrite``, then two documents are added (two commits).
* strays: the user's files put inside an existing index's ``parts/``, ``vectors/`` and
  ``prefilter/`` folders, then three commits.

Each case reports what the call did (refused with which error, or wrote) and which of the
user's files are still there, byte for byte.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

from colgraph_engine.kg import DocumentInput, Encoders, KnowledgeIndex

ENC = Encoders.offline(text_dim=32, patch_grid=4, patch_cell=2)


def doc(i: int) -> DocumentInput:
    return DocumentInput(f"d{i}", [f"Tokyo is linked to Osaka by train {i}. Mount Fuji is near Tokyo."])


def survivors(files: dict[Path, bytes]) -> list[str]:
    return sorted(p.name for p, data in files.items() if p.is_file() and p.read_bytes() == data)


def user_case(root: Path, how: str) -> dict:
    folder = root / how
    files = {folder / "parts" / "chapter1.txt": b"my chapter", folder / "vectors" / "emb.bin": b"\x00" * 64}
    for p, data in files.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    try:
        if how == "create":
            idx = KnowledgeIndex.create(folder, ENC)
        else:
            idx = KnowledgeIndex(ENC)
            idx.add_documents([doc(0)])
            idx.save(folder)
        idx.add_documents([doc(1)])
        idx.add_documents([doc(2)])
        outcome = "written"
    except (ValueError, OSError) as exc:
        outcome = f"refused: {type(exc).__name__}: {exc}"
    return {"case": how, "outcome": outcome, "user_files": len(files), "kept": survivors(files)}


def stray_case(root: Path) -> dict:
    path = root / "index"
    idx = KnowledgeIndex.create(path, ENC)
    idx.add_documents([doc(i) for i in range(12)])
    idx.enable_prefilter(min_tokens=20, rebuild_drift=None)
    files = {path / "parts" / "chapter1.txt": b"mine", path / "vectors" / "emb.bin": b"\x01" * 8,
             path / "prefilter" / "notes.txt": b"notes"}
    for p, data in files.items():
        p.write_bytes(data)
    idx.remove_document("d0")
    idx.add_documents([doc(30)])
    idx.remove_document("d5")
    return {"case": "strays in an index's folders", "outcome": "3 commits", "user_files": len(files),
            "kept": survivors(files)}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for row in (user_case(root, "create"), user_case(root, "save"), stray_case(root)):
            print(json.dumps(row))


if __name__ == "__main__":
    main()
