"""One prepared GPU run: every headline figure of the GPU check in one device call (<= 9 min).

Driven by ``benchmarks/gpu_all.sh`` (which only picks the interpreter and calls this). In order:

0. setup (seconds): the bundle's wheels (``gpu_bundle/whl``, made by ``scripts/gpu_bundle.sh``)
   installed with ``pip --no-index --no-deps --target`` into a scratch folder; the source tree laid
   out as the wheel installs it (``colgraph_engine/`` plus ``kernels/`` as
   ``colgraph_engine/kernels``, symlinks in a scratch folder); then, in the background, the native
   module built against the bundle's Debian igraph (``scripts/gpu_native_build.sh``: ``dpkg-deb -x``
   into a prefix, cmake with that prefix's pkg-config files), niced, while the GPU phases run;
1. ``maxsim`` (``gpu_maxsim.py`` with ``HEADLINE=1``, sections env, ceilings, correctness, store,
   rerank, candidates): ours vs fp64 and torch first, then rerank TFLOP/s at 32 queries x 8,192
   documents x 1,030 tokens (bf16, d = 128) beside late-interaction-kernels, 1 query x 1,024
   documents latency (``cg.maxsim`` and ``PackedStore.search``, eager and CUDA-graph replay), and
   per-query candidates (64 queries x 1,000 candidates of 10,000 documents) beside
   late-interaction-kernels' pair kernel and its gathered path;
2. ``prefilter`` (``gpu_prefilter.py --only "100k x 128" --nbits 2``): kernel and store checks
   against float64, then exact brute force (ours, late-interaction-kernels), the prefilter (dense
   one-query path: its stages' milliseconds, target <= 2 ms) and fast-plaid, recall@10 vs exact;
3. ``pipeline`` (``gpu_pipeline.py --docs 10000``): device vs CPU results equal up to ties first,
   then the pipeline's p50/p99, batched QPS and per-stage times at 10,000 documents, with the native
   graph module from step 0 when it built (else the numpy graph backend, and the report says so).

Each phase is a process of its own with its own time budget: it is told the budget (its scripts
stop starting work once spent) and killed 15 s past it, so a phase that hangs costs only its share;
later phases get what earlier ones left unused. The report is rewritten after every phase.

Output (``--out``, default ``$OUT`` when set, else ``benchmarks/results``), at most 6 files, so all
come back from the device (it returns 8): ``gpu_headline.md`` (the headline table, header: machine,
commit, threads, load) and ``gpu_headline.json`` (the same plus every phase's raw records),
``gpu_headline_maxsim.md``, ``gpu_headline_prefilter.md``, ``gpu_headline_pipeline.md`` (each
phase's own report) and ``gpu_all.log`` (every phase's output and the native build's). ``--quick``
writes the same names with ``_quick`` (``gpu_headline_quick.md``, ``gpu_headline_maxsim_quick.md``
...), marked as CPU checks, never GPU figures.

    bash benchmarks/gpu_all.sh                 # on the GPU machine, carrying gpu_bundle/ (benchmarks/README.md)
    bash benchmarks/gpu_all.sh --quick         # here: every phase at tiny shapes on the CPU, Triton interpreted

Exit status: 0 when every phase ran and every correctness check passed, 1 otherwise (the report
says which).
"""
from __future__ import annotations

import argparse
import datetime
import glob
import hashlib
import json
import os
import pathlib
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
T0 = time.monotonic()
KILL_GRACE_S = 15.0  # past its budget a phase is sent SIGTERM, then SIGKILL 10 s later
# Children run in process groups of their own (not sessions: the device ends a command's
# leftovers, except new sessions), so a phase is stopped with everything it started.
RUNNING: set = set()

# (phase, seconds it is given when nothing before it saved time, the least it is started with)
FULL_PLAN = (("maxsim", 140.0, 60.0), ("prefilter", 100.0, 45.0), ("pipeline", 220.0, 120.0))
QUICK_PLAN = (("maxsim", 600.0, 60.0), ("prefilter", 400.0, 45.0), ("pipeline", 400.0, 60.0))
NATIVE_BUILD_LIMIT_S = 300.0
PREFILTER_TARGET_MS = 2.0  # the target for one query through the dense prefilter stages, 100k x 128


def elapsed() -> float:
    return time.monotonic() - T0


# ------------------------------------------------------------------------------------------
# Setup: wheels, the source layout, the interpreter's path
# ------------------------------------------------------------------------------------------

def install_wheels(py: str, wheels: list[str], site: pathlib.Path, log) -> dict:
    """Installs `wheels` into `site` without network or dependencies. All at once first; when
    that fails (a wheel for another Python, as here on the CPU check), one by one, keeping those
    that install. Returns ``{"installed": [...], "failed": {wheel: reason}}``."""
    out = {"installed": [], "failed": {}}
    if not wheels:
        return out
    base = [py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--disable-pip-version-check",
            "--target", str(site)]
    r = subprocess.run(base + wheels, capture_output=True, text=True)
    if r.returncode == 0:
        out["installed"] = [os.path.basename(w) for w in wheels]
        return out
    for w in wheels:
        r = subprocess.run(base + ["--upgrade", w], capture_output=True, text=True)
        if r.returncode == 0:
            out["installed"].append(os.path.basename(w))
        else:
            out["failed"][os.path.basename(w)] = (r.stderr.strip().splitlines() or ["?"])[-1][:200]
    log.write(f"wheels: {json.dumps(out)}\n")
    return out


def make_layout(scratch: pathlib.Path) -> pathlib.Path:
    """The installed package layout from the source tree, as symlinks (the wheel maps the top-level
    kernels/ to colgraph_engine/kernels): every entry of colgraph_engine/ plus kernels/."""
    src = scratch / "src"
    pkg = src / "colgraph_engine"
    pkg.mkdir(parents=True)
    for entry in sorted((REPO / "colgraph_engine").iterdir()):
        if entry.name.startswith("_core") and entry.suffix == ".so":
            continue  # a module built here for another igraph or Python; the device builds its own
        (pkg / entry.name).symlink_to(entry)
    (pkg / "kernels").symlink_to(REPO / "kernels")
    return src


def editable_finder(py: str) -> bool:
    """Whether `py`'s site-packages hold an editable install of colgraph_engine, whose import hook
    would win over PYTHONPATH (a developer's venv). Then phases run with ``-S`` and the site
    folders on PYTHONPATH instead, so the source layout (and a freshly built _core) is what loads."""
    code = ("import site, glob, os; print(any(glob.glob(os.path.join(p, '_editable_*colgraph_engine*.pth')) "
            "for p in site.getsitepackages()))")
    r = subprocess.run([py, "-c", code], capture_output=True, text=True)
    return r.stdout.strip() == "True"


class Env:
    """How phases are started: interpreter (plus ``-S`` where needed) and PYTHONPATH."""

    def __init__(self, py: str, src: pathlib.Path, site: pathlib.Path):
        self.py, self.src, self.site = py, src, site
        self.no_site = editable_finder(py)
        self.extra = []
        if self.no_site:
            r = subprocess.run([py, "-c", "import site; print('\\n'.join(site.getsitepackages()))"],
                               capture_output=True, text=True, check=True)
            self.extra = [p for p in r.stdout.splitlines() if p]

    def argv(self, *args: str) -> list[str]:
        return [self.py] + (["-S"] if self.no_site else []) + list(args)

    def environ(self, **over: str | None) -> dict:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(self.src), str(self.site)] + self.extra
                                            + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env["PYTHONUNBUFFERED"] = "1"
        env.setdefault("HF_HUB_OFFLINE", "1")
        for k, v in over.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        return env


# ------------------------------------------------------------------------------------------
# Processes with a budget
# ------------------------------------------------------------------------------------------

def _on_signal(signum, frame):
    """SIGTERM/SIGINT to the driver (a call's time limit): stop the children, then exit; the
    report written after the last finished phase stays."""
    for p in list(RUNNING):
        stop_group(p)
    raise SystemExit(128 + signum)


def stop_group(p: subprocess.Popen) -> None:
    """SIGTERM to the process group `p` leads, SIGKILL 10 s later if it is still there."""
    try:
        os.killpg(p.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def run_phase(name: str, argv: list[str], env: dict, budget_s: float, log) -> dict:
    """Runs one phase, its output appended to `log`; killed KILL_GRACE_S past `budget_s`."""
    log.write(f"\n===== phase {name}: budget {budget_s:.0f} s, at {elapsed():.0f} s: {' '.join(argv)}\n")
    log.flush()
    t = time.monotonic()
    started = round(elapsed(), 1)
    p = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, process_group=0)
    RUNNING.add(p)
    killed = False
    try:
        rc = p.wait(budget_s + KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        killed = True
        stop_group(p)
        rc = p.returncode
    RUNNING.discard(p)
    s = time.monotonic() - t
    log.write(f"===== phase {name}: rc {rc}{' (killed at its limit)' if killed else ''} after {s:.0f} s\n")
    log.flush()
    print(f"gpu_headline: phase {name}: rc {rc}{' (killed at its limit)' if killed else ''} in {s:.0f} s "
          f"(budget {budget_s:.0f} s; {elapsed():.0f} s in all)", flush=True)
    return {"rc": rc, "killed": killed, "started_at_s": started, "seconds": round(s, 1), "budget_s": round(budget_s, 1)}


class NativeBuild:
    """scripts/gpu_native_build.sh in the background (niced, two cores left to the GPU phases)."""

    def __init__(self, env: Env, deb_dir: pathlib.Path, scratch: pathlib.Path, all_from_prefix: bool):
        self.log_path = scratch / "native_build.log"
        self.info: dict = {"deb_dir": str(deb_dir)}
        self.proc = None
        self.t0 = time.monotonic()
        if not glob.glob(str(deb_dir / "*.deb")):
            self.info["skipped"] = f"no .deb files in {deb_dir} (run scripts/gpu_bundle.sh and carry gpu_bundle)"
            return
        jobs = max(1, (os.cpu_count() or 2) - 2)
        argv = ["nice", "-n", "19", "bash", str(REPO / "scripts" / "gpu_native_build.sh"), str(deb_dir),
                str(scratch / "prefix"), str(scratch / "build")] + (["--all-from-prefix"] if all_from_prefix else [])
        e = env.environ(PYTHON=env.py, BUILD_JOBS=str(jobs))
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(argv, cwd=REPO, env=e, stdout=self.log, stderr=subprocess.STDOUT,
                                     process_group=0)
        RUNNING.add(self.proc)
        self.info["jobs"] = jobs

    def wait(self, limit_s: float) -> dict:
        """Waits up to `limit_s` more seconds; returns info with ``so`` (the module) when it built."""
        if self.proc is None or "rc" in self.info:
            return self.info
        try:
            rc = self.proc.wait(max(0.0, limit_s))
        except subprocess.TimeoutExpired:
            stop_group(self.proc)
            rc = None
            self.info["error"] = f"not done within {limit_s:.0f} s more; stopped"
        RUNNING.discard(self.proc)
        self.log.close()
        self.info["rc"] = rc
        self.info["seconds"] = round(time.monotonic() - self.t0, 1)
        lines = self.log_path.read_text(errors="replace").splitlines()
        self.info["tail"] = lines[-12:]
        last = lines[-1].strip() if lines else ""
        if rc == 0 and last.endswith(".so") and os.path.exists(last):
            self.info["so"] = last
            # when it finished, on the run's clock: whether the compile overlapped timed phases
            self.info["done_at_s"] = round(os.path.getmtime(last) - (time.time() - elapsed()), 1)
            self.info["import_check"] = next((x for x in lines if "import ok" in x), "")
        elif "error" not in self.info:
            self.info["error"] = f"build failed (rc {rc}): " + " | ".join(lines[-4:])[:600]
        return self.info


def probe_native(env: Env, extra_env: dict) -> dict:
    """Where the pipeline phase's interpreter finds colgraph_engine, _core and libigraph."""
    code = r"""
import json, colgraph_engine as cg
from colgraph_engine import _native
maps = [l.split()[-1] for l in open('/proc/self/maps').read().splitlines() if 'libigraph' in l]
print(json.dumps({'colgraph_engine': cg.__file__, 'native': _native.available(),
                  'reason': _native.reason_unavailable,
                  'core': getattr(_native.core, '__file__', None), 'libigraph': maps[0] if maps else None}))
"""
    # cwd outside the repository: with -c the current folder comes first on sys.path, and the
    # repository's own colgraph_engine/ (no _core in it) would shadow the layout the phases use
    r = subprocess.run(env.argv("-c", code), cwd=env.src.parent, env=env.environ(**extra_env), capture_output=True,
                       text=True)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": (r.stderr or r.stdout).strip()[-500:]}


# ------------------------------------------------------------------------------------------
# Reading the phases' outputs into headline figures
# ------------------------------------------------------------------------------------------

def _rows(path: pathlib.Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return out


def _find(rows, **match):
    return next((r for r in rows if all(r.get(k) == v for k, v in match.items()) and "error" not in r), None)


# gpu_maxsim.py's rerank rows read for the headline figures: figure key (``<key>_ms``) -> the row's impl
RERANK_IMPLS = {"ours": "ours cg.maxsim", "ours_launcher": "ours km.maxsim_cross", "lik": "lik.maxsim",
                "lik_varlen": "lik.maxsim_varlen", "torch": "torch GEMM+amax",
                "colpali": "colpali score_multi_vector[torch]"}


def maxsim_figures(rows: list[dict], shapes: dict) -> dict:
    """Headline figures from gpu_maxsim.jsonl records (None where a row is missing)."""
    f: dict = {}
    big_nq, big_nd, small_nd = shapes["rerank_big"][0], shapes["rerank_big"][1], shapes["latency_nd"]
    checks = [r for r in rows if "check" in r]
    f["correctness"] = {"checks": len(checks),
                        "failed": [f"{r['config']}: {r['check']}" for r in checks if not r["ok"]]}
    for label, nq, nd in (("rerank", big_nq, big_nd), ("one_query", 1, small_nd)):
        got = {key: _find(rows, section="rerank", impl=impl, nq=nq, nd=nd) for key, impl in RERANK_IMPLS.items()}
        ours, lik = got["ours"], got["lik"]
        g = {"shape": f"{nq} q x {nd} docs x {ours['ld'] if ours else '?'} tokens",
             **{f"{key}_ms": r and r["ms"] for key, r in got.items()},
             "ours_TFLOPs": ours and ours["TFLOPs"], "lik_TFLOPs": lik and lik["TFLOPs"],
             "lik_rel_diff_vs_ours": lik and lik.get("rel_diff_vs_ours")}
        best_lik = min([x for x in (g["lik_ms"], g["lik_varlen_ms"]) if x], default=None)
        g["speedup_vs_lik"] = round(best_lik / g["ours_ms"], 3) if best_lik and g["ours_ms"] else None
        f[label] = g
    store = _find(rows, section="store", impl="ours PackedStore.search")
    graphed = next((r for r in rows if r.get("section") == "store" and "error" not in r
                    and str(r.get("impl", "")).startswith("ours GraphedSearch")), None)
    f["one_query"]["store_search_ms"] = store and store["ms"]
    f["one_query"]["graphed_ms"] = graphed and graphed["ms"]
    enq = _find(rows, section="store", what="host_enqueue_ms")
    f["one_query"]["host_enqueue_ms"] = enq and enq["median"]
    cand = {r["impl"]: r["ms_per_query"] for r in rows
            if r.get("section") == "candidates" and "ms_per_query" in r and "error" not in r}
    ours_c = cand.get("ours cg.maxsim_candidates")
    peers = {k: v for k, v in cand.items() if not k.startswith("ours")}
    best = min(peers, key=peers.get) if peers else None
    shape_row = _find(rows, section="candidates", impl="ours cg.maxsim_candidates")
    f["candidates"] = {"shape": shape_row and f"{shape_row['nq']} q x {shape_row['cand_per_query']} of "
                                              f"{shape_row['store']} docs",
                       "ours_ms_per_query": ours_c, "ours_TFLOPs": shape_row and shape_row["TFLOPs"],
                       "peers_ms_per_query": peers, "best_peer": best,
                       "speedup_vs_best_peer": round(peers[best] / ours_c, 3) if best and ours_c else None}
    ceil = {r["what"]: r for r in rows if r.get("section") == "ceilings" and "what" in r}
    f["ceilings"] = {"copy_TBps": ceil.get("d2d_copy", {}).get("TBps"),
                     "bf16_matmul_TFLOPs": ceil.get("bf16_matmul_8192", {}).get("TFLOPs")}
    env = next((r for r in rows if r.get("section") == "env" and "torch" in r), {})
    f["env"] = {k: env.get(k) for k in ("gpu", "sms", "torch", "triton", "cuda", "lik_version", "colpali_version",
                                        "fast_plaid_version", "colgraph_engine_from")}
    f["section_s"] = {r["section"]: r["section_s"] for r in rows if "section_s" in r}
    f["errors"] = [f"{r['section']}: {r.get('impl', r.get('what', ''))}: {r['error']}"[:300]
                   for r in rows if "error" in r]
    return f


def prefilter_figures(rep: dict, corpus: str) -> dict:
    rows = [r for r in rep.get("rows", []) if r.get("corpus") == corpus]
    f: dict = {"corpus": corpus, "checks": len(rep.get("checks", [])),
               "failed": [c["what"] for c in rep.get("checks", []) if not c.get("passed")]}
    ex = next((r for r in rows if r["impl"].startswith("exact brute force (ours")), None)
    lik = next((r for r in rows if r["impl"].startswith("exact brute force (late")), None)
    fp = next((r for r in rows if r["impl"].startswith("fast-plaid") and "qps" in r), None)
    f["exact_ours_ms_one_query"] = ex and ex["ms_one_query"]
    f["exact_lik_ms_one_query"] = lik and lik["ms_one_query"]
    f["fast_plaid"] = fp and {"ms_one_query": fp["ms_one_query"], "qps": fp["qps"], "recall10": fp["recall10"]}
    f["prefilter"] = []
    for r in rows:
        if r["impl"].startswith("prefilter"):
            f["prefilter"].append({"impl": r["impl"], "ms_one_query_dense": r.get("ms_one_query_dense"),
                                   "ms_one_query_sparse": r.get("ms_one_query"), "dense_used": r.get("one_query_dense"),
                                   "dense_stage_ms": r.get("one_query_stage_ms"), "recall10": r.get("recall10"),
                                   "qps": r.get("qps"), "build_s": r.get("build_s"),
                                   "bytes_per_token": r.get("bytes_per_token")})
    f["notes"] = [n.splitlines()[0][:300] for n in rep.get("notes", [])]
    return f


def pipeline_figures(rep: dict) -> dict:
    runs = rep.get("runs", {})
    single = runs.get("device:single", {})
    f = {"docs": rep.get("settings", {}).get("docs"), "images_per_doc": rep.get("settings", {}).get("images_per_doc"),
         "patches": rep.get("settings", {}).get("patches"), "device": rep.get("settings", {}).get("device"),
         "graph_backend": rep.get("index", {}).get("graph_backend"), "phase_done": rep.get("phase_done"),
         "check_passed": rep.get("check", {}).get("passed"), "check_index": rep.get("check", {}).get("check_index"),
         "p50_ms": single.get("p50_ms"), "p99_ms": single.get("p99_ms"), "queries": single.get("queries"),
         "stage_ms_per_query": single.get("stage_ms_per_query"),
         "qps": {k.split(":", 1)[1]: v.get("qps") for k, v in runs.items() if k.startswith("device:batch")},
         "cpu_p50_ms": runs.get("cpu:single", {}).get("p50_ms"), "ratios": rep.get("ratios"),
         "build_s": rep.get("index", {}).get("build_total_s"), "errors": rep.get("errors")}
    return f


# ------------------------------------------------------------------------------------------
# The report
# ------------------------------------------------------------------------------------------

def _v(x, fmt="{:.3g}") -> str:
    if x is None:
        return "not measured"
    if isinstance(x, float):
        return fmt.format(x)
    return str(x)


def _disagree(fig: dict) -> str:
    """A note when the peer's scores differ from ours by more than bf16 rounding explains."""
    d = fig.get("lik_rel_diff_vs_ours")
    if isinstance(d, (int, float)) and d > 1e-2:
        return f" **(its scores differ from ours: max rel diff {d:.3g})**"
    return ""


def commit_of() -> str:
    """``COLGRAPH_COMMIT`` when the caller names it (the device copy has no .git), else git's."""
    if os.environ.get("COLGRAPH_COMMIT"):
        return os.environ["COLGRAPH_COMMIT"] + " (as the caller named it)"
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    if r.returncode == 0 and r.stdout.strip():
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True).stdout.strip()
        return r.stdout.strip() + (" (+ uncommitted changes)" if dirty else "")
    return "unknown (no git here)"


def tree_hash() -> str:
    """sha256 over the sources the run executes (the device copy has no .git): a run can be matched
    to a commit by hashing the same files there."""
    h = hashlib.sha256()
    for pat in ("colgraph_engine/**/*.py", "kernels/*.py", "csrc/*", "benchmarks/gpu_*.py",
                "benchmarks/pipeline_report.py", "benchmarks/_harness.py", "scripts/gpu_*.sh", "CMakeLists.txt"):
        for p in sorted(REPO.glob(pat)):
            if p.is_file():
                h.update(str(p.relative_to(REPO)).encode())
                h.update(p.read_bytes())
    return h.hexdigest()[:16]


def maxsim_lines(m: dict) -> list[str]:
    """The headline table's rows of the maxsim phase: rerank, 1-query latency, candidates."""
    r, o, c = m["rerank"], m["one_query"], m["candidates"]
    best = c["best_peer"]
    return [f"| rerank {r['shape']} bf16: TFLOP/s | {_v(r['ours_TFLOPs'])} ({_v(r['ours_ms'])} ms) "
            f"| late-interaction-kernels maxsim {_v(r['lik_TFLOPs'])} ({_v(r['lik_ms'])} ms; varlen "
            f"{_v(r['lik_varlen_ms'])} ms){_disagree(r)} | {_v(r['speedup_vs_lik'])} |",
            f"| {o['shape']} latency, ms | cg.maxsim {_v(o['ours_ms'])}; PackedStore.search "
            f"{_v(o['store_search_ms'])}; CUDA graph {_v(o['graphed_ms'])}; host enqueue {_v(o['host_enqueue_ms'])} "
            f"| lik {_v(o['lik_ms'])}; torch {_v(o['torch_ms'])}; colpali-engine {_v(o['colpali_ms'])} "
            f"| {_v(o['speedup_vs_lik'])} |",
            f"| per-query candidates ({c['shape']}), ms per query | {_v(c['ours_ms_per_query'])} "
            f"| {(best + ' ' + _v(c['peers_ms_per_query'][best])) if best else 'no peer measured'} "
            f"| {_v(c['speedup_vs_best_peer'])} |"]


def prefilter_lines(pf: dict, quick: bool) -> list[str]:
    """One headline row per prefilter setting: the dense 1-query path against its target."""
    lines = []
    fp_ms = (pf["fast_plaid"] or {}).get("ms_one_query")
    for p in pf["prefilter"]:
        ms = p["ms_one_query_dense"]
        stages = ", ".join(f"{k} {v:.2f}" for k, v in (p.get("dense_stage_ms") or {}).items() if v)  # sparse: 0 here
        met = "" if quick or ms is None else " **met**" if ms <= PREFILTER_TARGET_MS else " **NOT met**"
        lines.append(f"| prefilter {pf['corpus']}: 1-query ms, dense path (target <= {PREFILTER_TARGET_MS:g}) — "
                     f"{p['impl']} | {_v(ms)}{met} (stages ms: {stages or '-'}; recall@10 "
                     f"{_v(p['recall10'])}; dense path taken: {p['dense_used']}) "
                     f"| fast-plaid {_v(fp_ms)}; exact lik {_v(pf['exact_lik_ms_one_query'])}, ours "
                     f"{_v(pf['exact_ours_ms_one_query'])} "
                     f"| {_v((fp_ms or 0) / ms if ms and pf['fast_plaid'] else None)} vs fast-plaid |")
    return lines


def render(rep: dict) -> str:
    q = rep["quick"]
    m, pf, pl = rep["figures"].get("maxsim"), rep["figures"].get("prefilter"), rep["figures"].get("pipeline")
    title = ("# GPU headline figures — CPU QUICK CHECK (tiny shapes, Triton interpreted): not GPU figures"
             if q else "# GPU headline figures (one run)")
    h = rep["header"]
    lines = [title, "",
             f"Machine: {h['machine']}; commit {h['commit']} (source hash {h['source_hash']}); threads: "
             f"{h['cpus']} CPUs, COLGRAPH_NUM_THREADS={h['colgraph_threads']}; load average at start "
             f"{h['load_start']}, at end {h.get('load_end')}; {h['date']}. `{h['command']}`; "
             f"{rep.get('total_s', 0):.0f} s in all.", ""]
    if q:
        lines += ["Every phase ran at tiny shapes on the CPU to check the code path; the figures below "
                  "are meaningless as speeds.", ""]
    lines += ["| figure | ours | peer | ratio (> 1: ours faster) |", "|---|---|---|---|"]
    lines += (maxsim_lines(m) if m else []) + (prefilter_lines(pf, q) if pf else [])
    if pl:
        lines.append(f"| pipeline p50 at {pl['docs']} documents ({pl['images_per_doc']} images x {pl['patches']} "
                     f"patches each), ms | {_v(pl['p50_ms'])} (p99 {_v(pl['p99_ms'])}; graph {pl['graph_backend']}) "
                     f"| CPU pipeline, same index: {_v(pl['cpu_p50_ms'])} "
                     f"| {_v((pl['ratios'] or {}).get('single p50: CPU / device'))} vs CPU |")
    lines += ["", "## Phases", "", "| phase | rc | started at s | seconds | budget s | note |",
              "|---|---|---|---|---|---|"]
    for name, ph in rep["phases"].items():
        lines.append(f"| {name} | {ph.get('rc')}{' (killed)' if ph.get('killed') else ''} "
                     f"| {ph.get('started_at_s', '-')} | {ph.get('seconds')} | {ph.get('budget_s')} "
                     f"| {ph.get('note', '')} |")
    nb = rep.get("native_build", {})
    built = "built " + nb["so"] if nb.get("so") else nb.get("error") or nb.get("skipped") or "not attempted"
    lines += ["", "## Native module", "",
              f"* build: {built} (finished {nb.get('done_at_s', '-')} s into the run, {nb.get('jobs', '-')} jobs, "
              "niced, beside the GPU phases)",
              f"* {nb.get('import_check', '')}".rstrip(),
              f"* the pipeline phase loaded: {json.dumps(rep.get('pipeline_native', {}))}", ""]
    lines += ["## Correctness", ""]
    if m:
        lines.append(f"* maxsim: {m['correctness']['checks']} checks, failed: {m['correctness']['failed'] or 'none'}")
    if pf:
        lines.append(f"* prefilter: {pf['checks']} checks, failed: {pf['failed'] or 'none'}")
    if pl:
        verdict = {True: "PASS", False: "FAIL"}.get(pl["check_passed"], "not run")
        lines.append(f"* pipeline: device vs CPU {verdict} on {pl['check_index']}")
    problems = rep.get("problems", [])
    lines += ["", "## Problems", ""] + ([f"* {p}" for p in problems] or ["* none"])
    lines += ["", "Each phase's own report: " + ", ".join(f"`{n}`" for n in rep.get("phase_reports", [])) +
              "; every record in the .json beside this file; the phases' output in `" + rep["log_name"] + "`.", ""]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------------

def phase_budget(steps, i: int, left_s: float) -> float:
    """Seconds for phase ``steps[i]`` (steps: ``(name, share, least)``) when `left_s` remain: its
    share plus whatever the phases before it left unused, but never so much that a later phase
    could not get its least."""
    share = steps[i][1]
    slack = max(0.0, left_s - sum(x[1] for x in steps[i:]))
    return min(share + slack, left_s - sum(x[2] for x in steps[i + 1:]))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="every phase at tiny shapes on the CPU (Triton interpreted)")
    ap.add_argument("--out", type=pathlib.Path, default=None, help="default: $OUT, else benchmarks/results")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="seconds for all phases (default 480 on a GPU: the call's 600 s less setup, kill grace "
                         "and margin)")
    ap.add_argument("--only", default="maxsim,prefilter,pipeline", help="comma list of phases")
    ap.add_argument("--bundle", type=pathlib.Path, default=REPO / "gpu_bundle")
    ap.add_argument("--pipeline-docs", type=int, default=10_000)
    ap.add_argument("--pipeline-images", type=int, default=2,
                    help="images per document in the pipeline phase (10 is the 100k-image target of "
                         "gpu_pipeline.py alone; its build does not fit beside the other phases)")
    ap.add_argument("--all-from-prefix", action="store_true",
                    help="load every carried library from the bundle's prefix, even where the system has one "
                         "(to prove on a machine with igraph installed that the prefix is what loads)")
    ap.add_argument("--python", default=sys.executable)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    # absolute (phases run from other folders), not resolved (a venv's python is a symlink)
    args.python = os.path.abspath(shutil.which(args.python) or args.python)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    quick = args.quick
    out = args.out or pathlib.Path(os.environ.get("OUT") or HERE / "results")
    out.mkdir(parents=True, exist_ok=True)
    sfx = "_quick" if quick else ""
    plan = QUICK_PLAN if quick else FULL_PLAN
    budget = args.budget_s or (sum(s for _, s, _ in plan) if quick else 480.0)
    only = [p for p in args.only.split(",") if p]
    unknown = set(only) - {p for p, _, _ in plan}
    if unknown or not only:
        raise SystemExit(f"gpu_headline.py: --only: expected a comma list of maxsim, prefilter, pipeline; "
                         f"got {args.only!r}")
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="gpu_headline."))
    log_path = out / f"gpu_all{sfx}.log"
    log = open(log_path, "w", buffering=1)
    json_path, md_path = out / f"gpu_headline{sfx}.json", out / f"gpu_headline{sfx}.md"

    try:
        import torch  # only to name the machine; the phases import their own
        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        torch_v = torch.__version__
    except Exception as exc:  # noqa: BLE001
        gpu, torch_v = None, f"torch failed to import: {exc!r}"
    rep: dict = {
        "quick": quick,
        "header": {"machine": (gpu or "no GPU") + f"; {platform.node()}; {platform.processor() or platform.machine()}; "
                              f"torch {torch_v}; Python {platform.python_version()}",
                   "commit": commit_of(), "source_hash": tree_hash(), "cpus": os.cpu_count(),
                   "colgraph_threads": os.environ.get("COLGRAPH_NUM_THREADS", "all (unset)"),
                   "load_start": [round(x, 2) for x in os.getloadavg()],
                   "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   "command": "bash benchmarks/gpu_all.sh " + " ".join(argv if argv is not None else sys.argv[1:])},
        "plan": {"budget_s": budget, "phases": [p for p in plan if p[0] in only]},
        "phases": {}, "figures": {}, "raw": {}, "problems": [], "phase_reports": [], "log_name": log_path.name,
    }

    def save():
        rep["total_s"] = round(elapsed(), 1)
        json_path.write_text(json.dumps(rep, indent=1, default=str) + "\n")
        md_path.write_text(render(rep))

    if not quick and gpu is None:
        rep["problems"].append("no CUDA device: this is the GPU run (use --quick on a CPU)")
        save()
        print(f"gpu_headline: no CUDA device; wrote {md_path}", file=sys.stderr)
        return 1

    # 0. setup
    site = scratch / "site"
    site.mkdir()
    wheels = sorted(glob.glob(str(args.bundle / "whl" / "*.whl")))
    rep["wheels"] = install_wheels(args.python, wheels, site, log)
    if not wheels:
        rep["problems"].append(f"no wheels in {args.bundle / 'whl'}: peers will be skipped (scripts/gpu_bundle.sh)")
    src = make_layout(scratch)
    env = Env(args.python, src, site)
    rep["setup"] = {"scratch": str(scratch), "no_site_mode": env.no_site, "setup_s": round(elapsed(), 1)}
    native = NativeBuild(env, args.bundle / "deb", scratch, args.all_from_prefix) if "pipeline" in only else None
    save()

    phase_env = {"COLGRAPH_DISABLE_NATIVE": "1"}  # maxsim and prefilter do not use the graph module
    if quick:
        phase_env["TRITON_INTERPRET"] = "1"
    scratch_out = scratch / "out"
    scratch_out.mkdir()
    steps = [p for p in plan if p[0] in only]
    for i, (name, share, least) in enumerate(steps):
        b = phase_budget(steps, i, budget - elapsed())
        if b < least:
            rep["phases"][name] = {"rc": None, "note": f"skipped: {b:.0f} s left for it, needs {least:.0f}"}
            rep["problems"].append(f"{name}: skipped, time budget")
            save()
            continue
        res = None
        try:
            inner = max(10.0, b - 20.0)  # the script's own budget: it stops starting work before the kill
            if name == "maxsim":
                e = env.environ(**phase_env, GPU_OUT=str(scratch_out), GPU_BUDGET_S=str(inner), HEADLINE="1",
                                SECTIONS="env,ceilings,correctness,store,rerank,candidates",
                                **({"SMOKE": "1"} if quick else {}))
                res = run_phase(name, env.argv(str(HERE / "gpu_maxsim.py")), e, b, log)
                rows = _rows(scratch_out / "gpu_maxsim.jsonl")
                shapes = ({"rerank_big": (3, 8), "latency_nd": 8} if quick
                          else {"rerank_big": (32, 8192), "latency_nd": 1024})
                rep["raw"]["maxsim"] = rows
                if rows:
                    rep["figures"]["maxsim"] = maxsim_figures(rows, shapes)
                    failed = rep["figures"]["maxsim"]["correctness"]["failed"]
                    if failed:
                        rep["problems"].append("maxsim correctness failed: " + "; ".join(failed))
                md = scratch_out / "gpu_maxsim.md"
            elif name == "prefilter":
                corpus = "1000 x 16" if quick else "100k x 128"
                e = env.environ(**phase_env, OUT=str(scratch_out), GPU_BUDGET_S=str(inner))
                argv_ = env.argv(str(HERE / "gpu_prefilter.py"), "--only", corpus, "--nbits", "2",
                                 "--sections", "check,corpora", *(["--quick"] if quick else []))
                res = run_phase(name, argv_, e, b, log)
                pj = scratch_out / f"gpu_prefilter{sfx}.json"
                if pj.exists():
                    raw = json.loads(pj.read_text())
                    rep["raw"]["prefilter"] = raw
                    rep["figures"]["prefilter"] = prefilter_figures(raw, corpus)
                    failed = rep["figures"]["prefilter"]["failed"]
                    if failed:
                        rep["problems"].append("prefilter checks failed: " + "; ".join(failed))
                md = scratch_out / f"gpu_prefilter{sfx}.md"
            else:  # pipeline
                info = native.wait(max(10.0, min(NATIVE_BUILD_LIMIT_S - (time.monotonic() - native.t0), b / 4))) \
                    if native else {"skipped": "not asked"}
                rep["native_build"] = info
                pe = dict(phase_env)
                if info.get("so"):
                    link = src / "colgraph_engine" / os.path.basename(info["so"])
                    if not link.exists():
                        link.symlink_to(info["so"])
                    pe["COLGRAPH_DISABLE_NATIVE"] = None  # removed from the phase's environment
                else:
                    why = str(info.get("error") or info.get("skipped"))[:300]
                    rep["problems"].append(f"native module not built ({why}): the pipeline ran on the numpy graph "
                                           "backend")
                rep["pipeline_native"] = probe_native(env, pe)
                if info.get("so") and not rep["pipeline_native"].get("native"):
                    rep["problems"].append(f"native module built but not loaded: {rep['pipeline_native']}")
                b = min(b, budget - elapsed())  # the wait came out of this phase's share
                inner = max(10.0, b - 20.0)
                argv_ = env.argv(str(HERE / "gpu_pipeline.py"), "--out", str(scratch_out), "--budget-s", f"{inner:.0f}",
                                 *(["--quick", "--device", "cpu"] if quick else
                                   ["--docs", str(args.pipeline_docs), "--images-per-doc", str(args.pipeline_images)]))
                res = run_phase(name, argv_, env.environ(**pe), b, log)
                pj = scratch_out / f"gpu_pipeline{sfx}.json"
                if pj.exists():
                    raw = json.loads(pj.read_text())
                    rep["raw"]["pipeline"] = raw
                    rep["figures"]["pipeline"] = pipeline_figures(raw)
                    if rep["figures"]["pipeline"]["check_passed"] is False:
                        rep["problems"].append("pipeline device vs CPU check failed")
                md = scratch_out / f"gpu_pipeline{sfx}.md"
        except Exception as exc:  # noqa: BLE001 - the driver itself must not stop the run
            import traceback
            res = dict(res or {"rc": None, "killed": False}, note=f"driver error: {exc!r}"[:300])
            rep["problems"].append(f"{name}: driver error {exc!r}"[:300])
            md = scratch_out / "none"
            log.write(traceback.format_exc())
        rep["phases"][name] = res
        if res["rc"] != 0:
            killed = " (killed at its time limit)" if res["killed"] else ""
            rep["problems"].append(f"{name}: exit status {res['rc']}{killed}; see {log_path.name}")
        if md.exists():
            dest = out / f"gpu_headline_{name}{sfx}.md"  # not gpu_{name}.md: the scripts' own full runs keep theirs
            text = md.read_text()
            if quick:
                text = "> CPU QUICK CHECK (tiny shapes, Triton interpreted): not GPU figures.\n\n" + text
            dest.write_text(text)
            if dest.name not in rep["phase_reports"]:
                rep["phase_reports"].append(dest.name)
        save()

    if native and native.proc is not None and "rc" not in native.info:
        rep["native_build"] = native.wait(0)
    log.write("\n===== native build log\n")
    if native and native.log_path.exists():
        log.write(native.log_path.read_text(errors="replace"))
    rep["header"]["load_end"] = [round(x, 2) for x in os.getloadavg()]
    save()
    log.close()
    shutil.rmtree(scratch, ignore_errors=True)
    print(md_path.read_text())
    print(f"gpu_headline: wrote {md_path}, {json_path.name}, {', '.join(rep['phase_reports'])} and {log_path.name} "
          f"in {out} ({elapsed():.0f} s)")
    return 1 if rep["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
