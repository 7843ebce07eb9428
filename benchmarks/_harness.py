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
import contextlib
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


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def proc_bytes(key: str, path: str = "/proc/self/status", default: int = 0) -> int:
    """Bytes of the ``<key>: <n> kB`` line of `path` (``VmRSS``, ``VmHWM``, ``MemAvailable`` of
    /proc/meminfo ...), or `default` where the file or the line is absent (not Linux)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return default


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
           max_s: float | None = None, after: Callable[[str, Any], None] | None = None,
           settle: Callable[[str], None] | None = None) -> dict[str, list[float]]:
    """Interleaved timing: each round calls every row once, in an order that rotates per round,
    so load that comes and goes hits all rows alike. ``{name: [seconds per call]}``; a row whose
    call took longer than `max_s` stops being called. `after(name, result)`, untimed, gets what
    each timed call returned, right after it (before any other row runs); `settle(name)`,
    untimed, runs after every call, warm-ups included (after `after`), e.g. to wait until the
    process that answered has gone idle before the next row's call."""
    names = list(fns)
    for _ in range(warmup):
        for n in names:
            fns[n]()
            if settle is not None:
                settle(n)
    out: dict[str, list[float]] = {n: [] for n in names}
    live = list(names)
    for r in range(repeats):
        for n in live[r % len(live):] + live[:r % len(live)] if live else []:
            t0 = time.perf_counter()
            got = fns[n]()
            out[n].append(time.perf_counter() - t0)
            if after is not None:
                after(n, got)
            if settle is not None:
                settle(n)
        live = [n for n in live if max_s is None or out[n][-1] <= max_s]
    return out


def _thread_files(pid: int, name: str):
    """The text of ``/proc/<pid>/task/<tid>/<name>`` for every thread of process `pid` (nothing
    where /proc does not say; a thread that ends meanwhile is skipped)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/{name}") as f:
                yield f.read()
        except OSError:
            pass


def cpu_seconds(pid: int) -> float:
    """CPU time, in seconds, that every thread of process `pid` has run: the first field of each
    ``schedstat`` (nanoseconds), or ``stat``'s utime + stime (clock ticks) on a kernel without
    schedstat; 0.0 where /proc does not say."""
    ns = [int(x.split()[0]) for x in _thread_files(pid, "schedstat")]
    if ns:
        return sum(ns) / 1e9
    ticks = [sum(map(int, x.rsplit(")", 1)[1].split()[11:13])) for x in _thread_files(pid, "stat")]
    return sum(ticks) / os.sysconf("SC_CLK_TCK")


def runnable_threads(pid: int) -> int:
    """How many threads of process `pid` are running or waiting for a core (state ``R`` in
    ``/proc/<pid>/task/*/stat``); 0 where /proc does not say."""
    return sum(x.rsplit(")", 1)[1].split()[0] == "R" for x in _thread_files(pid, "stat"))


def wait_idle(pid: int, *, window_s: float = 0.005, busy_share: float = 0.1, max_s: float = 2.0) -> tuple[float, float]:
    """Waits until process `pid` has gone idle: its threads ran less than `busy_share` of one core
    over a `window_s` window and none is runnable (one waiting for a core runs no CPU, yet is not
    idle), or `max_s` passed. Returns ``(waited_s, cpu_s)``: the wall time waited
    and the CPU its threads ran meanwhile. What it is for: a process that answered may keep a core
    busy afterwards (OpenBLAS's worker threads busy-wait for the next call for a while before they
    sleep, its ``OPENBLAS_THREAD_TIMEOUT``; measured here at ~100 ms of CPU after each numpy product), and in an
    alternating comparison that work would land inside the *other* side's timed call."""
    t0, c0 = time.perf_counter(), cpu_seconds(pid)
    prev = c0
    while time.perf_counter() - t0 < max_s:
        time.sleep(window_s)
        cur = cpu_seconds(pid)
        if cur - prev < busy_share * window_s and not runnable_threads(pid):
            return time.perf_counter() - t0, cur - c0
        prev = cur
    return time.perf_counter() - t0, prev - c0


def stats(secs: list[float]) -> dict:
    """``ms_median``, ``ms_min``, ``ms_all`` of per-call seconds."""
    return {"ms_median": statistics.median(secs) * 1e3, "ms_min": min(secs) * 1e3, "ms_all": [s * 1e3 for s in secs]}


def percentile(xs: list[float], p: float) -> float:
    """The `p`-th percentile (0-100) of `xs`, nearest rank."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def synchronizer(device: Any) -> Callable[[], Any]:
    """``torch.cuda.synchronize`` for a CUDA `device` (a name or a torch.device), else a no-op: what
    :func:`time_each` calls around each timed call, so a call's time includes the device's queued work."""
    import torch
    return torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)


def time_each(fn: Callable[[Any], Any], inputs: list | range, *, sync: Callable[[], Any] | None = None,
              max_s: float | None = None, least: int = 2) -> tuple[list, list[float]]:
    """``(outputs, seconds)`` of one call ``fn(x)`` per `x` of `inputs` (different inputs; no warm-up:
    make one first), `sync()` before and after each call (see :func:`synchronizer`); once `max_s`
    seconds have passed since the first call, stops after at least `least` calls."""
    sync = sync or (lambda: None)
    outs, secs = [], []
    end = time.perf_counter() + max_s if max_s is not None else None
    for x in inputs:
        if end is not None and len(secs) >= least and time.perf_counter() > end:
            break
        sync()
        t0 = time.perf_counter()
        outs.append(fn(x))
        sync()
        secs.append(time.perf_counter() - t0)
    return outs, secs


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


def cell(key: str, spec: str = ".3f", none: str = "—") -> Callable[[dict], str]:
    """A :func:`table` column ``how``: ``row[key]`` formatted with `spec`, `none` when it is
    missing, None or NaN (a figure with no question to average over)."""
    def how(row: dict) -> str:
        x = row.get(key)
        return none if x is None or x != x else format(x, spec)
    return how


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


def section(title: str, items: list[str]) -> list[str]:
    """Markdown lines of a ``## title`` section with one ``* item`` bullet per item (none when `items` is empty)."""
    return [f"## {title}", "", *(f"* {x}" for x in items), ""] if items else []


@contextlib.contextmanager
def noted(notes: list[str], what: str):
    """Runs the ``with`` block; an exception in it is printed and added to `notes` as ``"<what>:
    <Type>: <message>"`` (400 characters at most) instead of ending the run, so one failing peer
    leaves the rest of the report."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - reported in the notes
        notes.append(f"{what}: {type(exc).__name__}: {exc}"[:400])
        print(notes[-1], file=sys.stderr, flush=True)


def write(stem: str, title: str, body: list[str], data: dict, out: Any = RESULTS, *, e: dict | None = None,
          command: str | None = None, echo: bool = True, head: list[str] | None = None) -> pathlib.Path | None:
    """Writes ``<out>/<stem>.md`` (title, environment header, `body`) and ``<stem>.json`` (`data`
    with ``env`` and ``command`` added); `out` None writes nothing. Returns the folder. `head`
    replaces the environment header (a report rendered again from a JSON older than :func:`env`)."""
    e = e if e is not None else env()
    command = command or command_line()
    text = "\n".join([f"# {title}", "", *(header(e, command) if head is None else head), "", *body]).rstrip() + "\n"
    if echo:
        print(text)
    if out is None:
        return None
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.md").write_text(text)
    (out / f"{stem}.json").write_text(json.dumps({"env": e, "command": command, **data}, indent=1, default=str) + "\n")
    return out


def write_whole(stem: str, title: str, body: list[str], data: dict, out: Any = RESULTS, **kw) -> pathlib.Path | None:
    """:func:`write` (same arguments) through a scratch folder in `out`, each file then renamed into
    place: a report rewritten after every phase and killed mid-write (a time limit) stays whole."""
    import tempfile
    if out is None:
        return write(stem, title, body, data, None, **kw)
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out, prefix=f".{stem}.") as tmp:
        write(stem, title, body, data, tmp, **kw)
        for ext in ("md", "json"):
            os.replace(pathlib.Path(tmp) / f"{stem}.{ext}", out / f"{stem}.{ext}")
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


def bar_panels(path: Any, panels: Mapping[str, tuple[list[str], Mapping[str, Mapping[str, float]]]], *,
               ylabel: str, title: str, log: bool = False, labels: str | None = "{:.2f}",
               rotation: int = 0) -> str | None:
    """:func:`bar_plot` panels side by side in one figure, sharing the y axis: ``panels[panel
    title] = (groups, series)`` as bar_plot takes them; panels are as wide as their groups.
    `labels` None leaves the bars unlabelled. Returns a note when skipped."""
    plt, note = matplotlib_or_note()
    if plt is None or path is None:
        print(note or "", file=sys.stderr)
        return note
    widths = [max(2, len(groups)) for groups, _ in panels.values()]  # room for a one-group panel's title
    fig, axes = plt.subplots(1, len(panels), figsize=(min(16, max(8, 0.45 * sum(widths) + 4)), 5.5), sharey=True,
                             squeeze=False, gridspec_kw={"width_ratios": widths})
    for ax, (name, (groups, series)) in zip(axes[0], panels.items()):
        width = 0.8 / max(1, len(series))
        for j, (label, vals) in enumerate(series.items()):
            xs = [i + (j - (len(series) - 1) / 2) * width for i, g in enumerate(groups) if vals.get(g) is not None]
            ys = [vals[g] for g in groups if vals.get(g) is not None]
            bars = ax.bar(xs, ys, width, label=label)
            if labels is not None:
                ax.bar_label(bars, labels=[labels.format(y) for y in ys], fontsize=7, rotation=90, padding=2)
        if log:
            ax.set_yscale("log")
        ax.set_xticks(range(len(groups)), groups, fontsize=7, rotation=rotation)
        ax.set_title(name, fontsize=9)
        ax.legend(fontsize=7)
        ax.margins(y=0.2)
    axes[0][0].set_ylabel(ylabel)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def line_panels(path: Any, xs: list[float], panels: Mapping[str, Mapping[str, Any]], *, xlabel: str,
                styles: Mapping[str, tuple[str, str | None]] | None = None, log_x: bool = True,
                size: tuple[float, float] = (10, 3.8)) -> str | None:
    """Line charts side by side, one per panel, over the same `xs`: ``panels[title] = {"ylabel": str,
    "series": {name: [y per x]}, "log_y": bool (default False)}``; ``styles[name] = (matplotlib format,
    colour)`` (default ``("o-", None)``). Returns a note when skipped."""
    plt, note = matplotlib_or_note()
    if plt is None or path is None:
        print(note or "", file=sys.stderr)
        return note
    fig, axes = plt.subplots(1, len(panels), figsize=size, squeeze=False)
    for ax, (title, panel) in zip(axes[0], panels.items()):
        for name, ys in panel["series"].items():
            style, color = (styles or {}).get(name, ("o-", None))
            ax.plot(xs, ys, style, color=color, label=name)
        ax.set(xlabel=xlabel, ylabel=panel["ylabel"], title=title, yscale="log" if panel.get("log_y") else "linear")
        if log_x:
            ax.set_xscale("log")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


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


# ------------------------------------------------------------------------------------------
# Reproducers: child processes, their memory, another checkout, a served index
# ------------------------------------------------------------------------------------------

def timed(fn: Callable[..., Any], *args, **kwargs) -> tuple[Any, float]:
    """``(fn(*args, **kwargs), seconds the call took)``."""
    t0 = time.perf_counter()
    value = fn(*args, **kwargs)
    return value, time.perf_counter() - t0


class ChildFailed(RuntimeError):
    """A child process printed no JSON line; ``rc`` is its exit status, ``stderr`` what it wrote there."""

    def __init__(self, rc: int, stderr: str):
        super().__init__(f"child died rc={rc}: {stderr[-3000:]}")
        self.rc, self.stderr = rc, stderr


def run_json(cmd: list[str], **kwargs) -> Any:
    """The last stdout line of ``subprocess.run(cmd, **kwargs)``, parsed as JSON; :class:`ChildFailed`
    when there is none (the child died or printed something else)."""
    done = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise ChildFailed(done.returncode, done.stderr) from None


def in_fresh_process(fn: Callable[..., Any], *args, **kwargs) -> Any:
    """``fn(*args, **kwargs)`` run in a new interpreter (multiprocessing's spawn: it inherits the
    environment, not this process's memory), its result returned; `fn` must be importable."""
    import multiprocessing
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(fn, args, kwargs)


def reset_peak(pid: int | str = "self") -> bool:
    """Resets the VmHWM of `pid` to its RSS now (``/proc/PID/clear_refs``); False where that is refused."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def checkout_env(tree: Any = None, **extra: str) -> dict[str, str]:
    """``os.environ`` plus `extra`, for child processes that import ``colgraph_engine`` from checkout `tree`
    (None or this checkout: no change): `tree` first on PYTHONPATH and the editable install's import
    redirection off (``SKBUILD_EDITABLE_SKIP``; its finder would load this checkout whatever PYTHONPATH
    says). That tree's native ``_core`` is used only when built or copied into it."""
    env = dict(os.environ, **extra)
    if tree is None or pathlib.Path(tree).resolve() == ROOT:
        return env
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), env.get("PYTHONPATH")]))
    skip = [f.path for f in sys.meta_path if type(f).__name__.startswith("ScikitBuild") and getattr(f, "path", None)]
    if skip:
        env["SKBUILD_EDITABLE_SKIP"] = os.pathsep.join(skip)
    return env


def blank_pdf(path: Any, pages: int, width: float = 612.0, height: float = 792.0) -> int:
    """Writes a PDF of `pages` blank pages (US letter by default, in points) with pypdfium2; its bytes."""
    import pypdfium2 as pdfium
    doc = pdfium.PdfDocument.new()
    try:
        for _ in range(pages):
            doc.new_page(width, height).close()
        doc.save(str(path))
    finally:
        doc.close()
    return pathlib.Path(path).stat().st_size


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_index(index: Any, *flags: str, wait_s: float = 120, **popen) -> tuple[subprocess.Popen, str]:
    """``(process, url)`` of ``colgraph serve INDEX --port P *flags`` on loopback, once ``/health``
    answers 200 (output discarded unless `popen` says otherwise); RuntimeError if it exits or hangs."""
    import httpx
    port = free_port()
    popen = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, **popen}
    proc = subprocess.Popen([sys.executable, "-m", "colgraph_engine", "serve", str(index), "--port", str(port),
                             *flags], **popen)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("colgraph serve exited at start")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("colgraph serve did not come up")


def stop(proc: subprocess.Popen, sig: int = 15, wait_s: float = 60) -> None:
    """Sends `sig` (default SIGTERM) to `proc` if it still runs, and waits for it."""
    if proc.poll() is None:
        proc.send_signal(sig)
    proc.wait(wait_s)


@contextlib.contextmanager
def served(index: Any, *flags: str, **kwargs):
    """:func:`serve_index` as a context: yields ``(process, url)``; the server is stopped on leaving."""
    proc, url = serve_index(index, *flags, **kwargs)
    try:
        yield proc, url
    finally:
        stop(proc)


# ------------------------------------------------------------------------------------------
# Device runs: records kept as they come, peers whose signatures drift, clustered synthetic data
# ------------------------------------------------------------------------------------------

def table_section(title: str, columns: list[tuple[str, Any]], rows: list[dict]) -> list[str]:
    """Markdown lines of a ``## title`` section holding :func:`table` (none when `rows` is empty)."""
    return [f"## {title}", "", *table(columns, rows), ""] if rows else []


def call_supported(fn: Callable[..., Any], *args, **kwargs) -> Any:
    """``fn(*args, **kwargs)`` without the keyword arguments `fn`'s signature does not take (a
    peer's versions add and drop them); everything is passed when the signature is not readable."""
    import inspect
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fn(*args, **kwargs)
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    return fn(*args, **kwargs)


def clustered_corpus(nd: int, ld: int, d: int, topics_per_doc: int, *, device: Any, n_topics: int = 8192,
                     noise: float = 0.35, seed: int = 0, chunk: int = 4096, dtype: Any = None) -> tuple:
    """``(topics [n_topics, d] fp32, doc_topics [nd, topics_per_doc] int64, docs [nd, ld, d])``: unit
    vectors, each document token one of its document's topics plus Gaussian noise of norm about
    `noise`, `dtype` bf16 by default. Drawn `chunk` documents at a time (bounded fp32 temporaries);
    the same seed and device give the same corpus."""
    import torch
    g = torch.Generator(device=device).manual_seed(seed)
    topics = torch.nn.functional.normalize(torch.randn(n_topics, d, device=device, generator=g), dim=-1)
    doc_topics = torch.randint(0, n_topics, (nd, topics_per_doc), device=device, generator=g)
    docs = torch.empty((nd, ld, d), device=device, dtype=dtype or torch.bfloat16)
    for a in range(0, nd, chunk):
        b = min(nd, a + chunk)
        which = torch.randint(0, topics_per_doc, (b - a, ld), device=device, generator=g)
        centre = topics[torch.gather(doc_topics[a:b], 1, which)]  # [b - a, ld, d]
        centre += (noise / d ** 0.5) * torch.randn(centre.shape, device=device, generator=g)
        docs[a:b] = torch.nn.functional.normalize(centre, dim=-1).to(docs.dtype)
        del centre, which
    return topics, doc_topics, docs


def clustered_queries(topics: Any, doc_topics: Any, nq: int, lq: int, *, noise: float = 0.5, seed: int = 1,
                      dtype: Any = None) -> tuple:
    """``(target [nq] int64, queries [nq, lq, d])`` for a :func:`clustered_corpus`: each query's
    tokens come from the topics of one target document, noisier than the documents' own."""
    import torch
    g = torch.Generator(device=topics.device).manual_seed(seed)
    d = topics.shape[1]
    target = torch.randint(0, doc_topics.shape[0], (nq,), device=topics.device, generator=g)
    which = torch.randint(0, doc_topics.shape[1], (nq, lq), device=topics.device, generator=g)
    centre = topics[torch.gather(doc_topics[target], 1, which)]
    centre += (noise / d ** 0.5) * torch.randn(centre.shape, device=topics.device, generator=g)
    return target, torch.nn.functional.normalize(centre, dim=-1).to(dtype or torch.bfloat16)


class RecordLog:
    """The records of a long run under a time budget, each appended to a JSONL file as it comes (a
    run killed at its limit keeps what it measured), with ``t_s`` (seconds since `t0`) added."""

    def __init__(self, path: Any, budget_s: float, t0: float | None = None):
        self.path = pathlib.Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(self.path, "w")
        self.budget_s, self.t0 = budget_s, time.time() if t0 is None else t0
        self.rows: list[dict] = []
        self.failed: list[str] = []  # failed correctness checks: the run's exit status

    def left_s(self) -> float:
        return self.budget_s - (time.time() - self.t0)

    def rec(self, **kw) -> dict:
        """Keeps, writes and prints (without its traceback) one record."""
        kw["t_s"] = round(time.time() - self.t0, 1)
        self.rows.append(kw)
        self.file.write(json.dumps(kw, default=str) + "\n")
        self.file.flush()
        print(json.dumps({k: v for k, v in kw.items() if k != "tb"}, default=str), flush=True)
        return kw

    def check(self, config: str, name: str, ok: bool, **values) -> None:
        """A correctness verdict (``section="correctness"``); a failed one is kept in ``failed``."""
        self.rec(section="correctness", config=config, check=name, ok=bool(ok), **values)
        if not ok:
            self.failed.append(f"{config}: {name}")

    def error(self, section: str, what: str, exc: BaseException, **context) -> None:
        """Records `exc` (and its traceback's tail) as the outcome of `what`."""
        import traceback
        self.rec(section=section, impl=what, error=repr(exc)[:500], tb=traceback.format_exc()[-1500:], **context)

    def guarded(self, section: str, what: str, fn: Callable[[], Any], **context) -> Any:
        """``fn()``, or None after recording its exception: one failing measurement ends nothing else."""
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - recorded
            self.error(section, what, exc, **context)
            return None

    def out_of_time(self, section: str, what: str, need_s: float = 0.0, **context) -> bool:
        """True (and recorded as skipped) when at most `need_s` seconds of the budget remain."""
        if self.left_s() > need_s:
            return False
        self.rec(section=section, impl=what, skipped=f"time budget (needs ~{need_s:.0f}s)", **context)
        return True
