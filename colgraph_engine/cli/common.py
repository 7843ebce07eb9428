"""What every ``colgraph`` command shares: the encoder sets and the ``--encoders``/``--device``
options, opening an index with the encoders its manifest records, the one-line error exit, JSON
output of numpy values and the disk-full message. It imports no command module."""
from __future__ import annotations

import argparse
import errno
import functools
import shutil
import sys
from pathlib import Path

import numpy as np


def _named_set(name: str):
    from ..encoders.sets import load_encoders
    return load_encoders(name)


# the named sets (factories of Encoders on the CPU); ``--encoders`` also takes FAMILY:PATH
ENCODER_SETS = {name: functools.partial(_named_set, name) for name in ("hashing", "models")}


def fail(message: str, code: int = 2):
    """Prints ``colgraph: <message>`` on one line to stderr and exits with `code`."""
    print(f"colgraph: {message}", file=sys.stderr)
    raise SystemExit(code)


def encoders_arg(text: str):
    """argparse type of ``--encoders``: an EncoderSpec (the error lists the valid names, or
    names the model folder and what it lacks)."""
    from ..encoders.sets import parse_spec
    try:
        return parse_spec(text)
    except (ValueError, FileNotFoundError) as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("encoders: ")) from None


def add_encoder_options(p, *, new_index: bool = False, scoring: bool = True) -> None:
    """``--encoders`` and ``--device`` of a command that encodes (and, with `scoring`, scores)."""
    from ..encoders.sets import valid_names
    what = ("encoders of a new index (default: models, MiniLM + EfficientNet); an existing index uses its own"
            if new_index else "the index's encoders (default: those its manifest records)")
    p.add_argument("--encoders", type=encoders_arg, default=None, metavar="SET", help=f"{what}: {valid_names()}")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]: where the models run"
                   + (" and the vectors are scored" if scoring else ""))


def checked_device(device: str) -> str:
    """`device` when it is usable here; else one line on stderr and exit 2."""
    from ..encoders.sets import EncodersUnavailable, check_device
    try:
        return str(check_device(device))
    except (ValueError, EncodersUnavailable) as exc:
        fail(str(exc).removeprefix("device: "))


def load_set(spec, device: str = "cpu", timings: dict | None = None, *, deferred: bool = False):
    """The encoders of `spec`, loaded once on `device` (their load seconds added to `timings`;
    `deferred`: each model on its first use, see :func:`~colgraph_engine.encoders.sets.load`);
    a missing package or folder: one line on stderr, exit 2."""
    from ..encoders.sets import EncodersUnavailable, load
    try:
        enc, seconds = load(spec, device, deferred=deferred)
    except EncodersUnavailable as exc:
        fail(str(exc))
    if timings is not None:
        timings.update(seconds)
    return enc


def _names(info: dict) -> str:
    return ", ".join(f"{r}={e['name']}" for r, e in (info or {}).items() if e)


def _open_index(path: str, which=None, device: str = "cpu", timings: dict | None = None, *,
                deferred: bool = False):
    """``(index, encoders)``: the index at `path` opened with the encoders its manifest records
    (the set `which` names, when given, must be that set), each model loaded once (`deferred`:
    on its first use)."""
    from ..encoders.sets import EncoderSpec, describe_spec, relocated, spec_of, with_recorded_rule, without_source
    from ..kg import KnowledgeIndex
    from ..kg.index import _read_manifest

    if isinstance(which, str):  # a caller in Python naming the set
        try:
            which = encoders_arg(which)
        except argparse.ArgumentTypeError as exc:
            fail(f"--encoders: {exc}")
    recorded = _read_manifest(Path(path))["encoders"]
    want = spec_of(recorded)
    if which is not None and want is not None and which.kind != want.kind:
        fail(f"the index at {path} was built with the {describe_spec(want)} encoders ({_names(recorded)}); "
             f"--encoders {which} is another set: pass --encoders {want} or leave --encoders out")
    if which is None and want is None:
        fail(f"the index at {path} was built with encoders that no --encoders set provides ({_names(recorded)}); "
             "open it from Python with those encoders")
    spec = want if which is None else with_recorded_rule(which, want)
    if which is None and want.is_family and not Path(want.path).is_dir():
        fail(f"the index at {path} was built with the {want.kind} model in {want.path}, which is not a folder "
             f"any more; if it moved, name it: --encoders {want.kind}:NEWPATH")
    enc = load_set(spec, device, timings, deferred=deferred)
    got = enc.describe()
    if got != recorded:
        src = (recorded.get("tokens") or {}).get("source")
        if isinstance(spec, EncoderSpec) and spec.is_family and src and without_source(got) == without_source(recorded):
            print(f"colgraph: the index records the {spec.kind} model in {src.get('path')}; using {spec.path} "
                  "(same name and dimensions)", file=sys.stderr)
            enc = relocated(enc, tuple(src.items()))
        else:
            fail(f"the index at {path} was built with encoders {_names(recorded)}; --encoders {spec} gives "
                 f"{_names(got)}" + (f": pass --encoders {want}" if want is not None else ""))
    return KnowledgeIndex.open(path, enc), enc


def _json_default(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, tuple):
        return list(x)
    return str(x)


def is_disk_full(exc: BaseException) -> bool:
    """True for "no space left on device" and "disk quota exceeded"."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def disk_full_message(exc: OSError, where) -> str:
    """One line: what ran out, at which path, the free space there and, when known, the space needed."""
    path = Path(exc.filename) if exc.filename else Path(where) if where is not None else Path.cwd()
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    what = "disk quota exceeded" if exc.errno == errno.EDQUOT else "no space left on device"
    try:
        usage = shutil.disk_usage(probe)
        space = f"{_size(usage.free)} free of {_size(usage.total)} on the file system of {probe}"
    except OSError:
        space = "free space unknown"
    needed = getattr(exc, "needed_bytes", None)
    need = f"; this commit needs at least {_size(needed)} for its vectors alone" if needed else ""
    return (f"{what} writing {path}: {space}{need}. Nothing of the failed commit was kept; "
            "free space (or choose another --out) and run the command again")


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:,} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1024
