"""The headline suite on the CPU: one table of ours against each peer, in one command.

    .venv/bin/python -m benchmarks            # about 5-10 minutes on 2 shared cores
    .venv/bin/python -m benchmarks --quick    # smaller shapes, about 3-5 minutes
    .venv/bin/python -m benchmarks --only maxsim,bfs

Each row is the ``headline()`` of one benchmark (checked against its reference, then timed
interleaved with its peer, see ``_harness``): MaxSim vs colpali-engine (``cpu_report``), BFS vs
scipy (``graph_report``), prefilter vs exact (``prefilter_report``), pipeline p50 vs LightRAG
(``lightrag_peer.py --quick`` / ``--docs 1000`` in its own processes, when LightRAG's venv exists),
HTTP overhead (``service_load``). Ratio: peer time / our time (> 1: ours faster). A row that
fails (a missing peer, a failed check) is reported as such and the suite goes on.
Writes ``results/headline.{md,json}`` (``headline_quick.*`` with ``--quick``).
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import pathlib
import subprocess
import sys
import tempfile
import time
import traceback

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import _harness as h  # noqa: E402

LIGHTRAG_VENV = HERE / ".cache" / "lightrag_peer" / "venv"


def lightrag(quick: bool) -> h.Headline:
    """Pipeline p50 per query vs LightRAG local (``lightrag_peer.py``, its JSON read back)."""
    what = "pipeline p50, one query, vs LightRAG 1.5.7 local"
    if not (LIGHTRAG_VENV / "bin" / "python").exists():
        return h.Headline(what, "—", "—", None, note=f"not run: LightRAG's venv is absent ({LIGHTRAG_VENV}; "
                          "`python benchmarks/lightrag_peer.py --quick` makes it)")
    out = pathlib.Path(tempfile.mkdtemp(prefix="headline_lightrag_"))
    cmd = [sys.executable, str(HERE / "lightrag_peer.py"), "--no-progress", "--out", str(out)]
    # --no-prefilter: the default config over a plain index (at these sizes the index's own
    # prefilter is deferred anyway); the prefilter-carrying copy would double the build time
    cmd += (["--quick"] if quick else ["--docs", "1000", "--queries", "60"]) + ["--no-prefilter"]
    try:
        proc = subprocess.run(cmd, cwd=HERE.parent, capture_output=True, text=True)
        found = sorted(out.glob("lightrag_peer*.json"))
        if proc.returncode != 0 or not found:
            return h.Headline(what, "—", "—", None, note=f"lightrag_peer.py exited {proc.returncode}: "
                              + (proc.stderr or proc.stdout)[-300:].replace("\n", " "))
        size = json.loads(found[0].read_text())["sizes"][-1]
    finally:
        shutil.rmtree(out, ignore_errors=True)
    rows, ratios = size.get("rows") or {}, size.get("ratios") or {}
    ours = next((r for r in ("ours", "ours-default-pf") if r in ratios), None)
    if ours is None or "lightrag-local" not in rows:
        return h.Headline(what, "—", "—", None, note=f"no ours/lightrag-local rows in {found[0]}")
    return h.Headline(f"{what}, {size['documents']:,} documents", f"{rows[ours]['p50_ms']:.2f} ms ({ours})",
                      f"LightRAG local {rows['lightrag-local']['p50_ms']:.2f} ms",
                      ratios[ours]["p50_speedup_vs_lightrag_local"],
                      f"LightRAG p50 / ours; hit rate ours {ratios[ours]['hit_rate_ours']:.2f}, "
                      f"LightRAG local {ratios[ours]['hit_rate_lightrag_local']:.2f}")


def _module(name: str):
    return lambda quick: __import__(name).headline(quick)


SUITE = {"maxsim": _module("cpu_report"), "bfs": _module("graph_report"), "prefilter": _module("prefilter_report"),
         "lightrag": lightrag, "http": _module("service_load")}


def main(argv=None) -> int:
    p = h.parser(__doc__)
    p.add_argument("--only", default="", help=f"comma-separated subset of {','.join(SUITE)}")
    args = p.parse_args(argv)
    unknown = set(filter(None, args.only.split(","))) - set(SUITE)
    if unknown:
        p.error(f"--only: unknown rows {sorted(unknown)}; expected a comma-separated subset of {','.join(SUITE)}")
    e = h.env()
    t0 = time.perf_counter()
    rows, failed = [], 0
    for key, fn in SUITE.items():
        if args.only and key not in args.only.split(","):
            continue
        print(f"[headline] {key} ...", file=sys.stderr, flush=True)
        t = time.perf_counter()
        try:
            row = fn(args.quick)
        except Exception as exc:  # noqa: BLE001 - one failing row must not hide the others
            traceback.print_exc()
            failed += 1
            row = h.Headline(key, "—", "—", None, note=f"failed: {type(exc).__name__}: {exc}"[:300])
        rows.append({**row.cells(), "seconds": time.perf_counter() - t})
        print(f"[headline] {key}: {rows[-1]['ratio_text']} ({rows[-1]['seconds']:.0f} s)", file=sys.stderr, flush=True)
    total = time.perf_counter() - t0
    cpu = sum(getattr(resource.getrusage(w), f) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
              for f in ("ru_utime", "ru_stime"))
    body = [f"Total run time {total:.0f} s ({total / 60:.1f} min), CPU time {cpu:.0f} s (this process and its "
            f"finished children; on a shared machine the wall time grows with the load above). Ratio = peer time / our time (> 1: ours "
            "faster); every row checked against its reference before timing, ours and the peer timed "
            "interleaved in the same run.", "",
            *h.table([("what", "what"), ("ours", "ours"), ("peer", "peer"), ("ratio:", "ratio_text"),
                      ("ratio is", "detail"), ("note", "note"), ("s:", lambda r: f"{r['seconds']:.0f}")], rows)]
    h.write(h.stem("headline", args), "Headline suite (CPU)", body, {"rows": rows, "total_s": total, "cpu_s": cpu}, args.out, e=e)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
