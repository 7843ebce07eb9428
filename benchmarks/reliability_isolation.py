"""Reproducer for issue 22, item 4: one file's failure must not kill the whole build.

A folder holds a long blank-page PDF (generated with pypdfium2) and a small ``good.md``;
``colgraph index build`` runs on it under an address-space limit (``RLIMIT_AS``, what
``ulimit -v`` sets), once per code tree: ``--before`` (a checkout of the original code, e.g.
``git worktree add /tmp/before_iso HEAD`` made before the change) and this tree, plus any
``--tree NAME=PATH``. Prints one JSON object: per tree the exit code, whether ``good.md`` is in
the index, the status, failure count and last failure of the PDF, the last line of stderr and the wall time.

    python benchmarks/reliability_isolation.py --before /tmp/before_iso [--pages 10000 200] [--limit-gb 6]
        [--tree NAME=PATH ...] [--md benchmarks/results/reliability_isolation.md]

A tree other than this one is imported through ``_harness.checkout_env`` (``PYTHONPATH``, and
``SKBUILD_EDITABLE_SKIP`` turning off the editable install's import redirection, which would
otherwise load this tree), in the command and in the worker processes it starts. Its native
module ``_core`` is then absent (the engine falls back to Python/torch), which changes no outcome here.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as h  # noqa: E402

GOOD = "# Good\n\nThe Matterhorn stands above Zermatt in Switzerland.\n"
# whether good.md is in the committed index at argv[1] (read by a fresh process, without the limit)
INDEXED = ("import sys; from colgraph_engine.kg.index import _read_manifest; from pathlib import Path; "
           "print('good.md' in [d['doc_id'] for d in _read_manifest(Path(sys.argv[1]))['documents']])")


def make_folder(folder: Path, pages: int) -> float:
    """big.pdf (`pages` blank US-letter pages) + good.md; returns the seconds generating took."""
    folder.mkdir(parents=True, exist_ok=True)
    seconds = h.timed(h.blank_pdf, folder / "big.pdf", pages)[1]
    (folder / "good.md").write_text(GOOD)
    return seconds


def run_build(tree: Path, folder: Path, out: Path, limit_gb: float, extra: list[str]) -> dict:
    env = h.checkout_env(tree)
    limit = int(limit_gb * 2**30)

    def cap():  # what `ulimit -v` does, in the child only
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    cmd = [sys.executable, "-m", "colgraph_engine", "index", "build", str(folder), "--out", str(out), "--json",
           *extra]
    done, seconds = h.timed(subprocess.run, cmd, env=env, preexec_fn=cap, capture_output=True, text=True,
                            cwd=tempfile.gettempdir())
    row = {"tree": str(tree), "rc": done.returncode, "seconds": round(seconds, 1), "command": " ".join(cmd[1:])}
    if done.returncode < 0:
        row["rc_shell"] = 128 - done.returncode  # what a shell shows: 134 = SIGABRT
    row["good_md_indexed"] = (out / "manifest.json").exists() and subprocess.run(
        [sys.executable, "-c", INDEXED, str(out)], capture_output=True, text=True, env=env).stdout.strip() == "True"
    try:
        docs = {d["doc_id"]: d for d in json.loads(done.stdout)["documents"]}
        big = docs.get("big.pdf", {})
        row["good_md_status"] = docs.get("good.md", {}).get("status")
        row["big_pdf"] = {"status": big.get("status"), "pages": big.get("pages"),
                          "failures": len(big.get("failures", [])),
                          "last_failure": (big.get("failures") or [None])[-1],
                          "notes": [n for n in big.get("notes", []) if "max_pages" in n]}
    except (json.JSONDecodeError, KeyError):
        row["big_pdf"] = None
    err = [ln for ln in done.stderr.splitlines() if ln.strip() and not ln.startswith("\r")]
    row["stderr_last"] = err[-1][-300:] if err else ""
    return row


def _cells(pages: int, pdf_mb: float, name: str, r: dict) -> dict:
    """One row of the Markdown table: a folder run by one code tree."""
    big = r["big_pdf"] or {}
    msg = big.get("last_failure") or (big.get("notes") or [None])[0] or r["stderr_last"] or "(none)"
    return {"big": f"{pages:,} pages, {pdf_mb:.2f} MB", "code": name,
            "rc": f"{r['rc']} (shell {r['rc_shell']})" if "rc_shell" in r else str(r["rc"]),
            "good": "yes" if r["good_md_indexed"] else "no",
            "what": f"{big['status']}, {big['pages']} pages read, {big['failures']} failures" if big else "-",
            "msg": msg.replace("|", "/")[:300], "s": r["seconds"]}


def markdown(rep: dict) -> str:
    rows = [_cells(f["pages"], f["pdf_mb"], name, r) for f in rep["folders"] for name, r in f["runs"].items()]
    return "\n".join([
        f"# One file's failure vs the whole build (issue 22, item 4) ({rep['date']})", "",
        f"Command: `python benchmarks/reliability_isolation.py {rep['args']}`. Machine: {rep['machine']}. "
        "Each folder: `big.pdf` (blank 612 x 792 pt pages, generated with pypdfium2) and `good.md`; "
        f"`colgraph index build DIR --out IX --json` under RLIMIT_AS = {rep['limit_gb']:g} GiB (`ulimit -v`), "
        "defaults otherwise.", "",
        *h.table([("big.pdf", "big"), ("code", "code"), ("exit code:", "rc"), ("good.md indexed", "good"),
                  ("big.pdf outcome", "what"), ("message", "msg"), ("wall s:", "s")], rows)]) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="a checkout of the code before the change")
    ap.add_argument("--tree", action="append", default=[], help="NAME=PATH: one more code tree to run")
    ap.add_argument("--pages", type=int, nargs="+", default=[10_000, 200], help="one folder per page count")
    ap.add_argument("--limit-gb", type=float, default=6.0)
    ap.add_argument("--extra", default="", help="more flags for `colgraph index build` (every tree)")
    ap.add_argument("--md", type=Path, default=None, help="also write the table here")
    args = ap.parse_args(argv)
    trees = {"before": args.before}
    for spec in args.tree:
        name, _, path = spec.partition("=")
        if not path:
            raise SystemExit(f"--tree: expected NAME=PATH, got {spec!r}")
        trees[name] = Path(path)
    trees["after"] = h.ROOT
    folders = []
    for pages in args.pages:
        with tempfile.TemporaryDirectory(prefix="reliability-isolation-") as tmp:
            folder = Path(tmp) / "docs"
            gen = make_folder(folder, pages)
            runs = {name: run_build(tree, folder, Path(tmp) / f"ix-{i}", args.limit_gb, args.extra.split())
                    for i, (name, tree) in enumerate(trees.items())}
            folders.append({"pages": pages, "pdf_mb": round((folder / "big.pdf").stat().st_size / 1e6, 2),
                            "generate_s": round(gen, 2), "runs": runs})
    rep = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "machine": f"{os.cpu_count()}-core {h.cpu_model()} (shared)", "limit_gb": args.limit_gb,
           "args": " ".join(sys.argv[1:] if argv is None else argv), "folders": folders}
    print(json.dumps(rep, indent=1))
    if args.md is not None:
        args.md.write_text(markdown(rep))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
