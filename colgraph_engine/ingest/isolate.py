"""Per-file isolation for :func:`~.folder.ingest`: files are read, built and encoded in a
supervised worker process, so that one file's crash is that file's failure.

Why a process: a 10,000-page PDF under a 6 GB address-space limit aborted ``colgraph index
build`` (SIGABRT inside a native library, no message) and ``good.md`` beside it was never
indexed. A ``try`` cannot catch a segfault or an abort, nor interrupt a native call that hangs;
a process boundary can. The parent sees a dead worker as end-of-file on a pipe, records the
file as failed with the signal's name, starts a new worker for the next file and goes on.

Why one long-lived worker, restarted only when it dies: the encoders (MiniLM, EfficientNet) and
the OCR engine take seconds to load, so a process per file would pay that for every file; a
crash is rare. The worker loads them once and serves file after file until it crashes, is
killed for running past ``timeout``, or exits after a memory error (a process that ran out of
memory once is not trusted with the next file). One worker, not a pool: the parent commits in
input order, and torch already spreads one file's encoding over every core.

Why a fresh interpreter (``spawn``-like, not ``fork``): forking a parent in which torch has
started its thread pools can deadlock the child (a lock held by a thread that does not exist
there). The worker is ``python -c`` importing this module, with the parent's ``sys.path``, on a
socket pair; unlike :mod:`multiprocessing`'s ``spawn`` it does not re-run the parent's main
module, which breaks scripts without a ``__main__`` guard, stdin and notebooks. What the fresh
interpreter cannot inherit it rebuilds: the encoders come from a picklable zero-argument factory
(:attr:`Isolation.encoders`, e.g. ``Encoders.offline`` or an entry of the CLI's
``ENCODER_SETS``), checked against the index's :meth:`~colgraph_engine.kg.Encoders.describe`
(the check the index makes on open) before any file is sent; objects that do not pickle (model
clients, the OCR engine) come from :attr:`Isolation.setup`, called once in the worker.

What crosses the pipe: path, document id and the call's options (pickled once per ingest call)
one way; the file's :class:`~.process.DocumentReport`, its
:class:`~colgraph_engine.kg.DocumentGraph` (pixels reduced to file paths) and its vectors back,
with plain :mod:`pickle` (tensors travel as bytes, not as shared-memory handles, which would
hold file descriptors and outlive a crash). Only the parent writes the index. The worker's
temporary files (image spools, page-limited PDF copies) go into a folder the parent makes
(the worker's ``TMPDIR``) and removes whenever the worker goes, so a killed worker leaves none.

Limits (ours): ``timeout`` is wall-clock seconds per file, measured by the parent from the
moment the file is sent (model loading does not count). ``memory_gb`` caps the worker's address
space (``RLIMIT_AS``) at what it has mapped after loading its encoders plus ``memory_gb`` GiB,
so that a runaway file meets MemoryError in the worker instead of the machine's OOM killer.
It is relative because a CUDA build of torch maps about 4.5 GB of libraries it never touches:
an absolute cap would mostly count those. Both are off when None.
"""
from __future__ import annotations

import faulthandler
import os
import pickle
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from .process import DocumentReport, Job, process_file
from .readers.dispatch import kind_by_name

DEFAULT_START_TIMEOUT = 600.0
# Ours: half an hour per file catches a hung native call while leaving room for a long scanned
# PDF with OCR on a slow machine (the 5,000 blank pages of benchmarks/reliability_isolation.py
# take about 4 minutes here).
DEFAULT_FILE_TIMEOUT = 1800.0
SETUP_KEYS = ("extractor", "vision", "caption", "ocr")
_HOOKS = ("extractor", "vision", "caption")


class WorkerError(RuntimeError):
    """The worker process could not start (its setup failed, it died or hung while loading)."""


def _check_seconds(name: str, value, *, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ValueError(f"{name}: expected a finite number > 0{' or None' if allow_none else ''}, got {value!r}")


def _check_picklable(name: str, value) -> None:
    try:
        pickle.dumps(value)
    except Exception as exc:
        raise TypeError(f"{name}: cannot be sent to the worker process ({type(exc).__name__}: {exc}); "
                        "pass a module-level function or a functools.partial of one, or isolate=False") from None


@dataclass(frozen=True)
class Isolation:
    """Settings of an isolated ingest (see the module docstring).

    Args:
        encoders: a picklable zero-argument callable returning the index's
            :class:`~colgraph_engine.kg.Encoders`, called in the worker. None: the index's
            encoders are pickled, or, when they do not pickle and describe themselves as
            ``Encoders.offline()``, rebuilt with it.
        setup: a picklable zero-argument callable called once in the worker, returning a dict
            with any of ``extractor``, ``vision``, ``caption`` (used where ingest got None) and
            ``ocr`` (used where the reader options have none): what cannot be pickled.
        timeout: seconds one file may take in the worker; past it the worker is killed and
            restarted and the file fails (default :data:`DEFAULT_FILE_TIMEOUT`; None: no limit).
        memory_gb: GiB the worker's address space may grow past what it holds after setup
            (None: no cap beyond the limits it inherits).
        start_timeout: seconds the worker may take to start and run its setup.
    """
    encoders: Callable[[], object] | None = None
    setup: Callable[[], dict] | None = None
    timeout: float | None = DEFAULT_FILE_TIMEOUT
    memory_gb: float | None = None
    start_timeout: float = DEFAULT_START_TIMEOUT

    def __post_init__(self):
        for name in ("encoders", "setup"):
            value = getattr(self, name)
            if value is not None:
                if not callable(value):
                    raise TypeError(f"{name}: expected a zero-argument callable or None, got {type(value).__name__}")
                _check_picklable(name, value)
        _check_seconds("timeout", self.timeout)
        _check_seconds("memory_gb", self.memory_gb)
        _check_seconds("start_timeout", self.start_timeout, allow_none=False)


class FileWorker:
    """A supervised worker process that processes files for :func:`~.folder.ingest`.

    Started on the first file, restarted after it dies, stopped by :meth:`close` (it is a context
    manager). Pass one as ``ingest(..., isolate=worker)`` to share it (and its loaded encoders)
    across calls, as ``colgraph index add`` does for several paths.

    Attributes: ``pid`` (the running worker's, or None), ``starts`` (workers started so far),
    ``model_calls`` (``{model: {"calls", "requests", "cache_hits", "retries", "failures"}}``
    summed over the worker's model clients, for hooks built by ``setup``).
    """

    def __init__(self, isolation: Isolation | None = None, encoders=None):
        from ..kg.vectors import Encoders

        isolation = Isolation() if isolation is None else isolation
        if not isinstance(isolation, Isolation):
            raise TypeError(f"isolation: expected an Isolation, got {type(isolation).__name__}")
        if encoders is not None and not isinstance(encoders, Encoders):
            raise TypeError(f"encoders: expected Encoders or None, got {type(encoders).__name__}")
        self.isolation = isolation
        self.expected = None if encoders is None else encoders.describe()
        self._factory, self._pickled = isolation.encoders, None
        if self._factory is None and encoders is not None:
            try:
                self._pickled = pickle.dumps(encoders)
            except Exception:
                if encoders.describe() != Encoders.offline().describe():
                    raise TypeError("isolate: the index's encoders cannot be pickled for the worker process; pass "
                                    "Isolation(encoders=<a picklable function returning them>)") from None
                self._factory = Encoders.offline
        self._proc = self._conn = self._tmp = None
        self.starts = 0
        self.model_calls: dict[str, dict] = {}

    # -- life cycle ---------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def check_encoders(self, encoders) -> None:
        """ValueError unless `encoders` describe themselves as the worker's do."""
        got = None if encoders is None else encoders.describe()
        if got != self.expected:
            raise ValueError(f"isolate: the worker was made for encoders {self.expected}, the index has {got}")

    def start(self) -> None:
        """Starts the worker and waits for its setup (WorkerError when it fails)."""
        if self._proc is not None:
            return
        ours, theirs = socket.socketpair()
        # the interpreter is told only where to import from: the parent's main module is not
        # re-run (multiprocessing's spawn would, which breaks scripts without a __main__ guard,
        # stdin and notebooks)
        boot = (f"import sys; sys.path[:] = {sys.path!r}; "
                f"from colgraph_engine.ingest.isolate import _worker_entry, _exit_now; _worker_entry({theirs.fileno()}); "
                f"_exit_now()")
        # the worker's temporary files (image spools, page-limited PDF copies) go into a folder of
        # ours, removed when the worker is gone: a killed worker cannot clean up after itself
        self._tmp = tempfile.mkdtemp(prefix="colgraph-ingest-worker-")
        env = {**os.environ, "TMPDIR": self._tmp}
        try:
            proc = subprocess.Popen([sys.executable, "-c", boot], pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                    env=env)
        except BaseException:
            shutil.rmtree(self._tmp, ignore_errors=True)
            raise
        finally:
            theirs.close()  # the worker holds the only other end: its death is EOF here
        self._proc, self._conn = proc, Connection(ours.detach())
        self.starts += 1
        try:
            _send(self._conn, (self._factory, self._pickled, self.isolation.setup, self.isolation.memory_gb))
            if not self._conn.poll(self.isolation.start_timeout):
                raise WorkerError(f"the ingest worker did not finish loading within {self.isolation.start_timeout:g} s")
            msg = _recv(self._conn)
        except (EOFError, OSError):
            code = self._reap()
            raise WorkerError(f"the ingest worker died while starting ({_exit_text(code)})") from None
        except WorkerError:
            self._kill()
            raise
        if msg[0] == "setup_failed":
            self._kill()
            raise WorkerError(f"the ingest worker's setup failed: {msg[1]}")
        if msg[1] != self.expected:
            self._kill()
            raise WorkerError(f"the worker's encoders {msg[1]} are not the index's {self.expected}")

    def close(self) -> None:
        """Stops the worker (asks, then kills after a few seconds)."""
        if self._proc is None:
            return
        try:
            _send(self._conn, ("stop",))
            self._proc.wait(5)
        except (OSError, EOFError, subprocess.TimeoutExpired):
            pass
        self._kill()

    def __enter__(self) -> FileWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def _kill(self) -> None:
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        if conn is not None:
            conn.close()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def _reap(self) -> int | None:
        """Waits for a worker that closed its pipe; its exit code (negative: the signal)."""
        try:
            code = self._proc.wait(10)
        except subprocess.TimeoutExpired:
            code = None
        self._kill()
        return code

    # -- files --------------------------------------------------------------------------------
    def task_of(self, job: Job) -> bytes:
        """The picklable part of `job`, pickled (TypeError naming the option that does not pickle)."""
        for name in _HOOKS:
            _check_picklable(name, getattr(job, name))
        for key, value in job.reader_options.items():
            _check_picklable(f"reader_options[{key!r}]", value)
        _check_picklable("build_options", job.build_options)
        return pickle.dumps({"reader_options": job.reader_options, "extractor": job.extractor, "vision": job.vision,
                             "caption": job.caption, "max_tokens": job.max_tokens, "on_failure": job.on_failure,
                             "build_options": job.build_options}, protocol=pickle.HIGHEST_PROTOCOL)

    def process(self, file: Path, doc_id: str, task: bytes):
        """``(report, graph, vectors)`` of one file, processed by the worker; a crash, a hang past
        the timeout or a lost worker becomes the report's failure (graph and vectors None)."""
        self.start()
        timeout = self.isolation.timeout
        try:
            _send(self._conn, ("file", str(file), doc_id, task))
            if not self._conn.poll(timeout):
                self._kill()
                return self._failed(file, doc_id, f"timed out after {timeout:g} s (file_timeout / --file-timeout); "
                                                  "the worker was killed, the next file gets a new one")
            msg = _recv(self._conn)
        except (EOFError, OSError):
            code = self._reap()
            return self._failed(file, doc_id, f"the worker process crashed on this file ({_exit_text(code)}); "
                                              "the next file gets a new one")
        except MemoryError:  # the result is too large for this process
            self._kill()
            return self._failed(file, doc_id, "the worker's result (graph and vectors) did not fit in this "
                                              "process's memory; not added")
        if msg[0] == "task_failed":
            self.close()
            raise WorkerError(f"the ingest worker cannot load this call's options: {msg[1]}")
        _, rep, graph, vectors, calls, restart = msg
        self._add_calls(calls)
        if restart:  # out of memory once: not trusted with the next file
            self.close()
        return rep, graph, vectors

    @staticmethod
    def _failed(file: Path, doc_id: str, why: str):
        return DocumentReport(str(file), doc_id, kind_by_name(Path(file).name) or "", status="failed",
                              failures=[why]), None, None

    def _add_calls(self, calls) -> None:
        for model, counts, failures in calls:
            total = self.model_calls.setdefault(model, {"calls": 0, "requests": 0, "cache_hits": 0, "retries": 0,
                                                        "failures": []})
            for k, v in counts.items():
                total[k] += v
            total["failures"] += failures


def _send(conn, msg) -> None:
    conn.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(conn):
    return pickle.loads(conn.recv_bytes())


def _exit_text(code: int | None) -> str:
    if code is None:
        return "it did not exit"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        why = {"SIGSEGV": "a segmentation fault in native code", "SIGABRT": "an abort in native code",
               "SIGKILL": "killed: the system's out-of-memory killer or a user",
               "SIGBUS": "a bus error in native code"}.get(name)
        return f"killed by {name}" + (f", {why}" if why else "")
    return f"exit status {code}"


def _is_memory_error(exc: BaseException | None) -> bool:
    return isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and "alloc" in str(exc).lower()
                                            and "memory" in str(exc).lower())


# -- the worker process ---------------------------------------------------------------------------

def _exit_now() -> None:
    """Ends the worker once it has served: streams flushed, then ``os._exit(0)``. The worker holds
    nothing to save (the parent writes the index and removes the worker's temporary folder), and
    the interpreter's own teardown with torch and the models loaded took about a second, which
    the parent's ``close`` waited out at the end of every ingest call (ours, measured on
    ``colgraph index build`` of 5 PDFs: 1.07 s of a 29.9 s run)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(0)


def _worker_entry(fd: int) -> None:
    """The worker process's entry point: serves on the socket `fd` (see :func:`_worker_main`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle (it stops us)
    faulthandler.enable()  # a native crash prints the Python stack to stderr before the worker dies
    conn = Connection(fd)
    try:
        config = _recv(conn)
    except Exception:  # the parent went away before sending anything
        return
    try:
        _worker_main(conn, *config)
    finally:
        conn.close()


def _worker_main(conn, factory, pickled, setup, memory_gb) -> None:
    """The worker: set up once, then process files until told to stop or the parent goes away."""
    try:
        encoders = pickle.loads(pickled) if pickled is not None else factory() if factory is not None else None
        extras = dict(setup() or {}) if setup is not None else {}
        unknown = sorted(set(extras) - set(SETUP_KEYS))
        if unknown:
            raise ValueError(f"setup: returned unknown key(s) {unknown}; known: {list(SETUP_KEYS)}")
        if memory_gb is not None:
            _cap_address_space(memory_gb)
        _send(conn, ("ready", None if encoders is None else encoders.describe()))
    except Exception as exc:
        _send(conn, ("setup_failed", f"{type(exc).__name__}: {exc}"))
        return
    if encoders is not None:  # models load while the first file is read
        from ..encoders.deferred import warm_in_background
        warm_in_background(encoders)
    seen: dict[int, tuple] = {}
    cached = (None, None)
    while True:
        try:
            msg = _recv(conn)
        except (EOFError, OSError):
            return
        if msg[0] == "stop":
            return
        _, file, doc_id, task = msg
        if cached[0] != task:
            try:
                options = pickle.loads(task)
            except Exception as exc:  # e.g. a hook defined in the parent's __main__ (a notebook)
                _send(conn, ("task_failed", f"{type(exc).__name__}: {exc}"))
                continue
            for name in _HOOKS:
                if options[name] is None:
                    options[name] = extras.get(name)
            if "ocr" not in options["reader_options"] and extras.get("ocr") is not None:
                options["reader_options"]["ocr"] = extras["ocr"]
            cached = (task, Job(encoders=encoders, **options))
        rep, graph, vectors, error = process_file(Path(file), doc_id, cached[1])
        restart = _is_memory_error(error)
        if restart:
            rep.failures[-1] += " (the worker ran out of memory" + (
                f"; its cap is {memory_gb:g} GiB past its start, --worker-memory-gb)" if memory_gb else ")")
        calls = _call_deltas(cached[1], seen)
        try:
            _send(conn, ("done", rep, graph, vectors, calls, restart))
        except Exception as exc:  # the result itself does not fit (memory) or does not pickle
            rep.status = "failed"
            rep.failures.append(f"send: {type(exc).__name__}: {exc}")
            del graph, vectors  # pickling built nothing that was sent; free them before the small reply
            _send(conn, ("done", rep, None, None, calls, True))
        if restart:
            return


def _cap_address_space(memory_gb: float) -> None:
    """RLIMIT_AS = the address space mapped now + `memory_gb` GiB (never above the inherited limit)."""
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = vm + int(memory_gb * 2**30)
    for inherited in (soft, hard):
        if inherited != resource.RLIM_INFINITY:
            cap = min(cap, inherited)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


def _call_deltas(job: Job, seen: dict) -> list:
    """``[(model, counter deltas, new FailedCalls)]`` of the hooks' model clients since last asked."""
    out, done = [], set()
    for name in _HOOKS:
        client = getattr(getattr(job, name), "client", None)
        if client is None or id(client) in done or not hasattr(client, "stats"):
            continue
        done.add(id(client))
        s, failures = client.stats, client.failures
        counts = {"calls": s.calls, "requests": s.requests, "cache_hits": s.cache_hits, "retries": s.retries}
        before, n_before = seen.get(id(client), ({k: 0 for k in counts}, 0))
        seen[id(client)] = (counts, len(failures))
        out.append((client.model, {k: counts[k] - before[k] for k in counts}, failures[n_before:]))
    return out


__all__ = ["DEFAULT_FILE_TIMEOUT", "DEFAULT_START_TIMEOUT", "FileWorker", "Isolation", "WorkerError"]
