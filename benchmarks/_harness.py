"""The one harness every benchmark is declared over.

What each benchmark used to repeat lives here: the environment header (machine, CPU model,
commit, load, threads, library versions), the reference check before any time is taken, warm-up
and interleaved pairing of ours against a peer (calls alternate, so a noisy neighbour slows both
sides alike), medians and ratios, the Markdown + JSON report in ``benchmarks/results/`` and the
standard bar plot (skipped, with a note, when matplotlib is absent).

A benchmark declares its workloads, its rows (ours and the peers) and its reference::

    rows = compare({"8x32 vs 512x1030": make_inputs},               # workload name -> inputs()
                   {"ours": lambda x: (lambda: ours(x)),             # row name -> build(inputs) -> fn()
                    "peer": lambda x: (lambda: peer(x))},
                   reference=lambda x: exact(x), check=close(1e-4),  # checked before timing
                   baseline="peer", repeats=5)
    report("my_bench", "My benchmark", rows, columns=[...], out=args.out)

Every row is a dict: ``workload``, ``impl``, ``status`` ("ok" or "skipped: why"), ``ms_median``,
``ms_min``, ``ms_all`` (one entry per timed call), ``err`` (what `check` returned), and
``ratio`` (``baseline ms / row ms``, > 1 when the row is faster) when the workload has a baseline.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import importlib.metadata
import json
import os
import pathlib
import platform
import shlex
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Mapping

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"


class CorrectnessError(AssertionError):
    """A row returned a wrong result; it must not be timed."""


# ------------------------------------------------------------------------------------------
# Environment
# ------------------------------------------------------------------------------------------

def cpu_model() -> str:
    """The first ``model name`` of /proc/cpuinfo (Linux), else platform.processor()."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def version(dist: str) -> str | None:
    """Installed version of distribution `dist`, or None."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def git_state() -> dict:
    """The commit measured (short and full) and whether the engine's files differ from it."""
    def git(*a):
        try:
            return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None
    return {"git_commit": git("rev-parse", "HEAD"), "commit": git("rev-parse", "--short", "HEAD"),
            "engine_changes_uncommitted": git("status", "--porcelain", "--", "colgraph_engine", "csrc") or ""}


def env(**extra) -> dict:
    """What the numbers depend on: CPU, cores, memory, load now, thread counts, versions, commit.

    `extra` entries (e.g. a peer's version) are added as they are."""
    import torch

    import colgraph_engine as cg
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        mem = None
    return {"timestamp": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "cpus_usable": usable,
            "memory_total_bytes": mem, "loadavg_start": os.getloadavg(),
            "python": platform.python_version(), "torch": torch.__version__, "triton": version("triton"),
            "numpy": version("numpy"), "torch_num_threads": torch.get_num_threads(),
            "COLGRAPH_NUM_THREADS": os.environ.get("COLGRAPH_NUM_THREADS"),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "colgraph_engine": cg.__version__, "colgraph_backends": cg.backends(), **git_state(), **extra}


def header(e: dict, command: str | None = None) -> list[str]:
    """Markdown lines naming machine, commit, threads and load (load read again now, at the end)."""
    dirty = " (engine files changed since)" if e.get("engine_changes_uncommitted") else ""
    lines = [f"- machine: {e['cpu_model']}, {e['cpu_count']} logical cores ({e['cpus_usable']} usable), "
             f"load average {e['loadavg_start'][0]:.1f} at start, {os.getloadavg()[0]:.1f} at end",
             f"- commit {e.get('commit')}{dirty}; {e['timestamp']}",
             f"- threads: torch {e['torch_num_threads']}, COLGRAPH_NUM_THREADS={e['COLGRAPH_NUM_THREADS']}, "
             f"OMP_NUM_THREADS={e['OMP_NUM_THREADS']}",
             f"- python {e['python']}, torch {e['torch']}, triton {e['triton']}, numpy {e['numpy']}, "
             f"colgraph_engine {e['colgraph_engine']}"]
    if command:
        lines.append(f"- command: `{command}`")
    return lines


def command_line() -> str:
    """The command that ran, as a reader would type it from the repository root."""
    argv0 = pathlib.Path(sys.argv[0])
    try:
        argv0 = argv0.resolve().relative_to(ROOT)
    except ValueError:
        pass
    head = ["-m", str(argv0.parent).replace("/", ".")] if argv0.name == "__main__.py" else [str(argv0)]
    return shlex.join(["python", *head, *sys.argv[1:]])


def parser(doc: str, *, quick: bool = True, out: Any = RESULTS) -> argparse.ArgumentParser:
    """An ArgumentParser titled by `doc`'s first line, with ``--out`` (and ``--quick``)."""
    p = argparse.ArgumentParser(description=((doc or "").strip().splitlines() or [""])[0])
    p.add_argument("--out", type=lambda s: pathlib.Path(s) if s else None, default=out,
                   help="folder for the .md/.json/.png reports")
    if quick:
        p.add_argument("--quick", action="store_true", help="a smoke run: small shapes, few calls")
    return p


def stem(name: str, args) -> str:
    """Report name for `args`: ``<name>_quick`` for a ``--quick`` run (kept out of the committed ones)."""
    return name + ("_quick" if getattr(args, "quick", False) else "")


# ------------------------------------------------------------------------------------------
# Reference check, timing, pairing
# ------------------------------------------------------------------------------------------

def close(tol: float):
    """A check: ``max |got - ref|`` over tensors/arrays (or tuples of them), raising over `tol`."""
    def check(name, got, ref):
        import numpy as np
        pairs = zip(got, ref) if isinstance(got, (tuple, list)) else [(got, ref)]
        err = 0.0
        for g, r in pairs:
            g, r = (np.asarray(v.double() if hasattr(v, "double") else v, dtype=float) for v in (g, r))
            if g.shape != r.shape:
                raise CorrectnessError(f"{name}: shape {g.shape}, reference {r.shape}")
            err = max(err, float(np.abs(g - r).max()) if g.size else 0.0)
        if not err <= tol:
            raise CorrectnessError(f"{name}: max abs error {err:.3g} exceeds {tol:.3g}")
        return err
    return check


def equal(name, got, ref):
    """A check: results must be equal (``==``, or torch.equal / numpy.array_equal for arrays)."""
    if hasattr(got, "equal") and hasattr(ref, "shape"):  # torch tensors (any dtype)
        same = got.shape == ref.shape and bool(got.equal(ref))
    else:
        same = got == ref
        if not isinstance(same, bool):
            import numpy as np
            same = bool(np.array_equal(np.asarray(got), np.asarray(ref)))
    if not same:
        raise CorrectnessError(f"{name}: result differs from the reference")
    return 0.0


def time_calls(fn: Callable[[], Any], repeats: int, *, warmup: int = 1, max_s: float | None = None) -> list[float]:
    """Seconds of up to `repeats` calls of `fn` after `warmup` untimed ones; stops early after a
    call longer than `max_s` so a slow peer does not dominate the run."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
        if max_s is not None and out[-1] > max_s:
            break
    return out


def paired(fns: Mapping[str, Callable[[], Any]], repeats: int, *, warmup: int = 1,
           max_s: float | None = None) -> dict[str, list[float]]:
    """Interleaved timing: each round calls every row once, in an order that rotates per round,
    so load that comes and goes hits all rows alike. ``{name: [seconds per call]}``; a row whose
    call took longer than `max_s` stops being called."""
    names = list(fns)
    for _ in range(warmup):
        for n in names:
            fns[n]()
    out: dict[str, list[float]] = {n: [] for n in names}
    live = list(names)
    for r in range(repeats):
        for n in live[r % len(live):] + live[:r % len(live)] if live else []:
            t0 = time.perf_counter()
            fns[n]()
            out[n].append(time.perf_counter() - t0)
        live = [n for n in live if max_s is None or out[n][-1] <= max_s]
    return out


def stats(secs: list[float]) -> dict:
    """``ms_median``, ``ms_min``, ``ms_all`` of per-call seconds."""
    return {"ms_median": statistics.median(secs) * 1e3, "ms_min": min(secs) * 1e3, "ms_all": [s * 1e3 for s in secs]}


def percentile(xs: list[float], p: float) -> float:
    """The `p`-th percentile (0-100) of `xs`, nearest rank."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def compare(workloads: Mapping[str, Callable[[], Any]], impls: Mapping[str, Callable[[Any], Callable[[], Any]]], *,
            check: Callable[[str, Any, Any], float] | None = None, reference: Callable[[Any], Any] | None = None,
            baseline: str | None = None, repeats: int = 5, warmup: int = 1, max_s: float | None = None,
            skip: Callable[[str], str | None] = lambda name: None, names: Callable[[str], list[str]] | None = None,
            interleave: bool = True, progress: bool = True) -> list[dict]:
    """Rows of every workload x implementation: checked first, then timed.

    `workloads` maps a name to ``inputs()`` (built once per workload, untimed); `impls` maps a row
    name to ``build(inputs) -> fn`` (a zero-argument callable; preparation in `build` is untimed).
    `check(row, got, ref)` gets ``fn()`` and ``reference(inputs)`` (or None without a reference),
    returns an error figure and raises :class:`CorrectnessError` when the row is wrong: nothing is
    timed before every row of a workload has passed. `names(workload)` picks the rows of one
    workload (default all), `skip(row)` says why a row cannot run here. Rows are timed together by
    :func:`paired` (or one after the other with ``interleave=False``); ``ratio`` is baseline / row.
    """
    rows = []
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(workloads), unit="workload")
    for wname, make in workloads.items():
        if bar is not None:
            bar.set_description(wname)
        inputs = make()
        ref = reference(inputs) if reference is not None else None
        fns, errs, group = {}, {}, []
        for name in (names(wname) if names else list(impls)):
            row = {"workload": wname, "impl": name}
            why = skip(name)
            if why:
                group.append({**row, "status": f"skipped: {why}"})
                continue
            fn = impls[name](inputs)
            errs[name] = check(name, fn(), ref) if check is not None else None  # raises before timing
            fns[name] = fn
            group.append({**row, "status": "ok"})
        if interleave:
            secs = paired(fns, repeats, warmup=warmup, max_s=max_s)
        else:
            secs = {n: time_calls(f, repeats, warmup=warmup, max_s=max_s) for n, f in fns.items()}
        for row in group:
            if row["status"] == "ok":
                row.update(stats(secs[row["impl"]]), err=errs[row["impl"]])
        add_ratios(group, baseline)
        rows += group
        del inputs, fns, ref
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    return rows


def add_ratios(rows: list[dict], baseline: str | None, key: str = "ms_median", field: str = "ratio",
               group: str = "workload") -> None:
    """Adds ``field = baseline[key] / row[key]`` to each timed row, within each `group` value."""
    if baseline is None:
        return
    base = {r[group]: r[key] for r in rows if r["impl"] == baseline and r.get(key)}
    for r in rows:
        if r.get(key) and r[group] in base:
            r[field] = base[r[group]] / r[key]


# ------------------------------------------------------------------------------------------
# Reports
# ------------------------------------------------------------------------------------------

def fmt(x, spec: str = ".2f", none: str = "—") -> str:
    """`x` formatted with `spec`, or `none` for None/missing."""
    return none if x is None else format(x, spec)


def table(columns: list[tuple[str, Any]], rows: list[dict]) -> list[str]:
    """A Markdown table. `columns` are ``(title, how)`` with `how` a row key or ``row -> str``;
    a title ending in ``:`` is right-aligned, one ending in ``^`` centred (the mark is dropped)."""
    titles = [t.rstrip(":^") for t, _ in columns]
    align = ["---:" if t.endswith(":") else ":---:" if t.endswith("^") else "---" for t, _ in columns]
    out = ["| " + " | ".join(titles) + " |", "|" + "|".join(align) + "|"]
    for r in rows:
        cells = [how(r) if callable(how) else str(r.get(how, "—")) for _, how in columns]
        out.append("| " + " | ".join(cells) + " |")
    return out


def write(stem: str, title: str, body: list[str], data: dict, out: Any = RESULTS, *, e: dict | None = None,
          command: str | None = None, echo: bool = True) -> pathlib.Path | None:
    """Writes ``<out>/<stem>.md`` (title, environment header, `body`) and ``<stem>.json`` (`data`
    with ``env`` and ``command`` added); `out` None writes nothing. Returns the folder."""
    e = e if e is not None else env()
    command = command or command_line()
    text = "\n".join([f"# {title}", "", *header(e, command), "", *body]).rstrip() + "\n"
    if echo:
        print(text)
    if out is None:
        return None
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.md").write_text(text)
    (out / f"{stem}.json").write_text(json.dumps({"env": e, "command": command, **data}, indent=1, default=str) + "\n")
    return out


def matplotlib_or_note():
    """``(pyplot, None)``, or ``(None, note)`` when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")  # headless: no display on benchmark machines
        import matplotlib.pyplot as plt
    except ImportError:
        return None, "plot skipped: matplotlib is not installed (pip install matplotlib)"
    return plt, None


def bar_plot(path: Any, groups: list[str], series: Mapping[str, Mapping[str, float]], *, ylabel: str,
             title: str, log: bool = True, labels: str = "{:.0f}") -> str | None:
    """The standard plot: one group of bars per entry of `groups`, one bar per `series` name
    (``series[name][group] = value``; missing values leave a gap). Returns a note when skipped."""
    plt, note = matplotlib_or_note()
    if plt is None or path is None:
        print(note or "", file=sys.stderr)
        return note
    width = 0.8 / max(1, len(series))
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(groups) + 4), 5.5))
    for j, (name, vals) in enumerate(series.items()):
        xs = [i + (j - (len(series) - 1) / 2) * width for i, g in enumerate(groups) if vals.get(g) is not None]
        ys = [vals[g] for g in groups if vals.get(g) is not None]
        bars = ax.bar(xs, ys, width, label=name)
        ax.bar_label(bars, labels=[labels.format(y) for y in ys], fontsize=7, rotation=90, padding=2)
    if log:
        ax.set_yscale("log")
    ax.set_xticks(range(len(groups)), groups, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, ncol=3)
    ax.margins(y=0.2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def ms_series(rows: list[dict], key: str = "ms_median", group: str = "workload") -> tuple[list[str], dict]:
    """``(groups, series)`` for :func:`bar_plot` from timed rows: one series per ``impl``."""
    groups = list(dict.fromkeys(r[group] for r in rows))
    series: dict[str, dict] = {}
    for r in rows:
        series.setdefault(r["impl"], {})
        if r.get(key) is not None:
            series[r["impl"]][r[group]] = r[key]
    return groups, series


@dataclasses.dataclass
class Headline:
    """One row of the headline table (``python -m benchmarks``): ours against a peer."""

    what: str
    ours: str
    peer: str
    ratio: float | None
    detail: str = ""
    note: str = ""

    def cells(self) -> dict:
        return {**dataclasses.asdict(self), "ratio_text": fmt(self.ratio, ".2f") + ("×" if self.ratio else "")}
