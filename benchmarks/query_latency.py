"""Query latency of `colgraph query` and `colgraph serve` with the default encoders, cold and warm.

Usage (from the repository root)::

    .venv/bin/python benchmarks/query_latency.py            # ~5 min on 2 idle cores (two index builds)
    .venv/bin/python benchmarks/query_latency.py --quick    # one cold run per side, 3 warm queries

Two indexes of the same documents, built by `colgraph index build` in this run: the default
encoders (``models``: MiniLM tokens + text, EfficientNet patches) and the model-free baseline
(``--encoders hashing``). Documents: a 9-page PDF of ``../shared/data/mmlongbench-dev`` (read in
place, never copied) when present, else a generated Markdown corpus (said so in the report).

Per side:

* **cold**: a new process runs ``colgraph query INDEX QUESTION`` (wall time from outside:
  interpreter start, imports, loading the models once, opening the index, the query). A driver
  process also splits one cold run into import, model load (the seconds
  ``colgraph_engine.encoders.sets.load`` reports, per model), index open and first query;
* **warm, same process**: the same question again in that driver process (models loaded, index
  open, graph assembled);
* **warm, through serve**: ``colgraph serve`` started once; the median of POST /query round trips
  after one warm-up query, and the load seconds its ``/info`` reports.

Ratios are given side by side in the same run: models / hashing for each latency, and cold / warm.
"""
from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
DATA = ROOT.parent / "shared" / "data" / "mmlongbench-dev" / "documents"
sys.path.insert(0, str(HERE))

import _harness as h  # noqa: E402

PDFS = ("2303.05039v2.pdf",)  # 9 pages, text layer (latency, not ingest, is measured here)
QUESTIONS = ("What does the paper propose, and how is it evaluated?",
             "Which figure shows the results of the main experiment?",
             "Which datasets are used in the experiments?")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}

# run in a fresh interpreter: the phases of one cold query, then warm queries in the same process
DRIVER = r"""
import json, sys, time
t0 = time.perf_counter()
from colgraph_engine.cli import _open_index
from colgraph_engine.pipeline import Pipeline
t_import = time.perf_counter() - t0
load = {}
t1 = time.perf_counter()
index, enc = _open_index(sys.argv[1], None, "cpu", load)
t_open = time.perf_counter() - t1 - sum(load.values())
pipe = Pipeline(index, enc)
qs = json.loads(sys.argv[2])
t2 = time.perf_counter()
pipe.retrieve(qs[0])
t_first = time.perf_counter() - t2
warm = []
for q in qs * int(sys.argv[3]):
    t = time.perf_counter()
    pipe.retrieve(q)
    warm.append(time.perf_counter() - t)
print(json.dumps({"import_s": t_import, "load_s": load, "open_s": t_open, "first_query_s": t_first, "warm_s": warm}))
"""


def corpus(folder: pathlib.Path) -> str:
    folder.mkdir()
    if all((DATA / p).is_file() for p in PDFS):
        for p in PDFS:
            (folder / p).symlink_to(DATA / p)
        return f"{len(PDFS)} MMLongBench-Doc dev PDFs ({', '.join(PDFS)}), text layer and page images"
    for i in range(6):
        (folder / f"doc{i}.md").write_text(f"# Report {i}\n\n" + " ".join(
            f"Section {j} of report {i} describes experiment {j} on dataset D{j} with model M{i}." for j in range(60)))
    return "6 generated Markdown reports (../shared/data/mmlongbench-dev is absent here)"


def colgraph(what: str, *args: str) -> subprocess.CompletedProcess:
    """``colgraph ARGS`` in a new process; ends the run, naming `what`, if it fails."""
    p = subprocess.run([sys.executable, "-m", "colgraph_engine", *args], capture_output=True, text=True, env=ENV,
                       cwd=ROOT)
    if p.returncode:
        raise SystemExit(f"{what} failed: {p.stderr[-2000:]}")
    return p


def serve_latency(index: pathlib.Path, repeats: int) -> dict:
    """``colgraph serve``: seconds to healthy, its /info load seconds, POST /query round trips after a warm-up."""
    import httpx

    (proc, url), start_s = h.timed(h.serve_index, index, "--no-isolate", "--log-level", "warning", env=ENV, cwd=ROOT)
    try:
        with httpx.Client(base_url=url, timeout=120) as c:
            info = c.get("/info").json()
            c.post("/query", json={"question": QUESTIONS[0]}).raise_for_status()  # warm-up: the graph view
            _, secs = h.time_each(lambda q: c.post("/query", json={"question": q}).raise_for_status(),
                                  QUESTIONS * repeats)
    finally:
        h.stop(proc)
    return {"start_to_healthy_s": start_s, "encoder_load_s": info.get("encoder_load_s"), "warm_s": secs}


def measure(tmp: pathlib.Path, side: str, flags: list[str], cold_runs: int, warm_repeats: int) -> dict:
    """One side: its index build, cold queries in new processes, the driver's phases, warm serve queries."""
    print(f"{side}: building", file=sys.stderr, flush=True)
    index = str(tmp / side)
    p, build_s = h.timed(colgraph, f"{side}: index build", "index", "build", str(tmp / "docs"), "--out", index, *flags,
                         "--json")
    cold = [h.timed(colgraph, f"{side}: query", "query", index, QUESTIONS[i % len(QUESTIONS)], "--json")[1]
            for i in range(cold_runs)]
    phases = h.run_json([sys.executable, "-c", DRIVER, index, json.dumps(QUESTIONS), str(warm_repeats)], env=ENV,
                        cwd=ROOT)
    print(f"{side}: cold {cold}, phases {phases}", file=sys.stderr, flush=True)
    report = json.loads(p.stdout)
    return {"build_s": build_s, "pages": report.get("totals", {}).get("pages"),
            "documents": len(report.get("documents", [])), "cold_s": cold, "phases": phases,
            "serve": serve_latency(tmp / side, warm_repeats)}


def row(side: str, s: dict) -> dict:
    """Milliseconds of one side's table row (medians of the cold and warm calls)."""
    med = statistics.median
    return {"side": side, "cold_ms": med(s["cold_s"]) * 1e3, "load_ms": sum(s["phases"]["load_s"].values()) * 1e3,
            "import_ms": s["phases"]["import_s"] * 1e3, "first_ms": s["phases"]["first_query_s"] * 1e3,
            "warm_ms": med(s["phases"]["warm_s"]) * 1e3, "serve_ms": med(s["serve"]["warm_s"]) * 1e3}


def _ms(key: str, spec: str = ".0f"):
    return lambda r: h.fmt(r[key], spec)


def main() -> None:
    args = h.parser(__doc__).parse_args()
    cold_runs, warm_repeats = (1, 1) if args.quick else (3, 3)
    e = h.env()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        docs_what = corpus(tmp / "docs")
        sides = {side: measure(tmp, side, flags, cold_runs, warm_repeats)
                 for side, flags in (("models", []), ("hashing", ["--encoders", "hashing"]))}
    rows = [row(side, s) for side, s in sides.items()]
    m, b = rows
    ratios = {k: m[k] / b[k] for k in ("cold_ms", "warm_ms", "serve_ms")}
    cold_over_warm = {r["side"]: r["cold_ms"] / r["warm_ms"] for r in rows}
    loads = "; ".join(f"{k}: " + (", ".join(f"{n} {v:.2f} s" for n, v in s["phases"]["load_s"].items()) or "none")
                      for k, s in sides.items())
    body = [f"Documents: {docs_what}; {sides['models']['pages']} pages. Questions: {len(QUESTIONS)} fixed ones "
            f"(cold: {cold_runs} new process(es) per side; warm: the median of {len(QUESTIONS) * warm_repeats} "
            "queries). Default pipeline config, CPU.", "",
            *h.table([("encoders", "side"), ("cold query, new process (ms)", _ms("cold_ms")),
                      ("of which imports (ms)", _ms("import_ms")), ("model load (ms)", _ms("load_ms")),
                      ("first query in process (ms)", _ms("first_ms")),
                      ("warm, same process (ms)", _ms("warm_ms", ".1f")),
                      ("warm, through serve (ms)", _ms("serve_ms", ".1f"))], rows), "",
            f"Ratios in this run: models / hashing {ratios['cold_ms']:.2f}x cold, {ratios['warm_ms']:.2f}x warm "
            f"(same process), {ratios['serve_ms']:.2f}x through serve; cold / warm "
            + ", ".join(f"{k} {v:.0f}x" for k, v in cold_over_warm.items()) + ".", "",
            f"Model load seconds (per model): cold driver {loads}; serve's /info "
            + "; ".join(f"{k}: {s['serve']['encoder_load_s']}" for k, s in sides.items()) + ".",
            "Index builds (`colgraph index build`, isolated worker): "
            + ", ".join(f"{k} {s['build_s']:.0f} s" for k, s in sides.items()) + "."]
    h.write(h.stem("query_latency", args), "Query latency, cold and warm, default encoders vs hashing", body,
            {"sides": sides, "rows": rows, "ratios_models_over_hashing": ratios, "cold_over_warm": cold_over_warm},
            args.out, e=e)


if __name__ == "__main__":
    main()
