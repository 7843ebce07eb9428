"""Reproducer for issue 22, item 4: one file's failure must not kill the whole build.

A folder holds a long blank-page PDF (generated with pypdfium2) and a small ``good.md``;
``colgraph index build`` runs on it under an address-space limit (``RLIMIT_AS``, what
``ulimit -v`` sets), once per code tree: ``--before`` (a checkout of the original code, e.g.
``git worktree add /tmp/before_iso HEAD`` made before the change) and this tree, plus any
``--tree NAME=PATH``. Prints one JSON object: per tree the exit code, whether ``good.md`` is in
the index, the status, failure count and last failure of the PDF, the last line of stderr and the wall time.

    python benchmarks/reliability_isolation.py --before /tmp/before_iso [--pages 10000 200] [--limit-gb 6]
        [--tree NAME=PATH ...] [--md benchmarks/results/reliability_isolation.md]

A tree other than this one is imported through ``PYTHONPATH``; ``SKBUILD_EDITABLE_SKIP`` turns
off the editable install's import redirection (which would otherwise load this tree), in the
command and in the worker processes it starts. Its native module ``_core`` is then absent (the
engine falls back to Python/torch), which changes no outcome here.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
GOOD = "# Good\n\nThe Matterhorn stands above Zermatt in Switzerland.\n"


def make_folder(folder: Path, pages: int) -> float:
    """big.pdf (`pages` blank US-letter pages) + good.md; returns the seconds generating took."""
    import pypdfium2 as pdfium

    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    doc = pdfium.PdfDocument.new()
    for _ in range(pages):
        doc.new_page(612, 792)
    doc.save(folder / "big.pdf")
    doc.close()
    (folder / "good.md").write_text(GOOD)
    return time.perf_counter() - t0


def _editable_build_dir() -> str | None:
    """The build folder the editable install's import finder answers for (its skip key)."""
    for finder in sys.meta_path:
        if type(finder).__name__.startswith("ScikitBuild") and getattr(finder, "path", None):
            return finder.path
    return None


def run_build(tree: Path, folder: Path, out: Path, limit_gb: float, extra: list[str]) -> dict:
    env = dict(os.environ)
    if tree.resolve() != HERE:
        env["PYTHONPATH"] = str(tree)
        skip = _editable_build_dir()
        if skip:
            env["SKBUILD_EDITABLE_SKIP"] = skip
    limit = int(limit_gb * 2**30)

    def cap():  # what `ulimit -v` does, in the child only
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    cmd = [sys.executable, "-m", "colgraph_engine", "index", "build", str(folder), "--out", str(out), "--json",
           *extra]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, preexec_fn=cap, capture_output=True, text=True, cwd=tempfile.gettempdir())
    seconds = time.perf_counter() - t0
    row = {"tree": str(tree), "rc": done.returncode, "seconds": round(seconds, 1), "command": " ".join(cmd[1:])}
    if done.returncode < 0:
        row["rc_shell"] = 128 - done.returncode  # what a shell shows: 134 = SIGABRT
    row["good_md_indexed"] = _indexed(out, env)
    try:
        rep = json.loads(done.stdout)
        docs = {d["doc_id"]: d for d in rep["documents"]}
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


def _indexed(out: Path, env: dict) -> bool:
    """Whether good.md is in the committed index (read by a fresh process, without the limit)."""
    code = ("import sys; from colgraph_engine.kg.index import _read_manifest; from pathlib import Path; "
            "print('good.md' in [d['doc_id'] for d in _read_manifest(Path(sys.argv[1]))['documents']])")
    if not (out / "manifest.json").exists():
        return False
    done = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, env=env)
    return done.stdout.strip() == "True"


def markdown(rep: dict) -> str:
    lines = [f"# One file's failure vs the whole build (issue 22, item 4) ({rep['date']})", "",
             f"Command: `python benchmarks/reliability_isolation.py {rep['args']}`. Machine: {rep['machine']}. "
             "Each folder: `big.pdf` (blank 612 x 792 pt pages, generated with pypdfium2) and `good.md`; "
             f"`colgraph index build DIR --out IX --json` under RLIMIT_AS = {rep['limit_gb']:g} GiB (`ulimit -v`), "
             "defaults otherwise.", "",
             "| big.pdf | code | exit code | good.md indexed | big.pdf outcome | message | wall s |",
             "|---|---|---:|---|---|---|---:|"]
    for f in rep["folders"]:
        for name, r in f["runs"].items():
            big = r["big_pdf"]
            what = "-" if big is None else f"{big['status']}, {big['pages']} pages read, {big['failures']} failures"
            msg = ((big or {}).get("last_failure") or ((big or {}).get("notes") or [None])[0] or r["stderr_last"]
                   or "(none)")
            rc = f"{r['rc']} (shell {r['rc_shell']})" if "rc_shell" in r else str(r["rc"])
            lines.append(f"| {f['pages']:,} pages, {f['pdf_mb']:.2f} MB | {name} | {rc} | "
                         f"{'yes' if r['good_md_indexed'] else 'no'} | {what} | {msg.replace('|', '/')[:300]} | "
                         f"{r['seconds']} |")
    return "\n".join(lines) + "\n"


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
    trees["after"] = HERE
    folders = []
    for pages in args.pages:
        with tempfile.TemporaryDirectory(prefix="reliability-isolation-") as tmp:
            folder = Path(tmp) / "docs"
            gen = make_folder(folder, pages)
            runs = {name: run_build(tree, folder, Path(tmp) / f"ix-{i}", args.limit_gb, args.extra.split())
                    for i, (name, tree) in enumerate(trees.items())}
            folders.append({"pages": pages, "pdf_mb": round((folder / "big.pdf").stat().st_size / 1e6, 2),
                            "generate_s": round(gen, 2), "runs": runs})
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
               platform.processor())
    rep = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "machine": f"{os.cpu_count()}-core {cpu} (shared)", "limit_gb": args.limit_gb,
           "args": " ".join(sys.argv[1:] if argv is None else argv), "folders": folders}
    print(json.dumps(rep, indent=1))
    if args.md is not None:
        args.md.write_text(markdown(rep))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
