"""A client for OpenAI-compatible chat-completions endpoints, made for batch ingest.

:class:`ChatClient` wraps ``openai.OpenAI`` (whose own retries are switched off) and adds what an
ingest of thousands of segments needs:

* retries with exponential backoff and jitter on timeouts, connection errors, HTTP 408, 429 and
  5xx, honouring ``Retry-After`` / ``retry-after-ms``; other 4xx fail at once (a bad request
  does not get better by repeating it);
* a bound on requests in flight (``concurrency``), held by a semaphore around each HTTP request,
  so it holds however many threads call :meth:`ChatClient.complete`;
* an optional :class:`~colgraph_engine.ingest.cache.ResponseCache` (a hit makes no request);
* a record of every call that finally failed (:attr:`ChatClient.failures`) and counters
  (:attr:`ChatClient.stats`).

Images travel as base64 data URLs in OpenAI's content-part format
(``{"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,..."}}``), downscaled so
that their longer side is at most ``max_side`` pixels (default :data:`DEFAULT_MAX_SIDE` = 1024,
our choice: enough for slide text to stay legible, small enough to keep requests well under a
megabyte) and encoded as JPEG quality 90 (ours as well).
"""
from __future__ import annotations

import base64
import email.utils
import io
import os
import random
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .cache import ResponseCache, request_key

DEFAULT_MAX_SIDE = 1024
JPEG_QUALITY = 90
ROLES = ("system", "user", "assistant")
# Retry-After values beyond this are not waited out in full (a server asking for an hour would
# stall the whole ingest); the retry then happens after this many seconds. Our choice.
MAX_RETRY_AFTER = 60.0
_INSTALL_HINT = "pip install colgraph_engine[llm]"


def _import_openai():
    try:
        import openai
    except ImportError as exc:  # optional dependency
        raise ImportError(f"ChatClient needs the 'openai' package ({exc}); install it with: {_INSTALL_HINT}") from exc
    return openai


# -- records ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ChatRequest:
    """One call for :meth:`ChatClient.complete_many`: OpenAI-style ``messages`` (a list of
    ``{"role": "system"|"user"|"assistant", "content": str | list[content part]}``), what the call
    is for (``purpose``, e.g. ``"extract"``), where its input comes from (``where``, e.g.
    ``"report.pdf segment 3"``) and an optional ``max_tokens`` overriding the client's."""
    messages: list
    purpose: str = "chat"
    where: str = ""
    max_tokens: int | None = None


@dataclass(frozen=True)
class ChatReply:
    """A successful call. ``attempts`` counts HTTP requests made (0 for a cache hit); ``seconds``
    is the wall time of the whole call, backoff included; ``finish_reason`` is the endpoint's
    (``"stop"``, ``"length"`` when cut at max_tokens, ...; a cached entry keeps the original)."""
    text: str
    cached: bool
    attempts: int
    seconds: float
    finish_reason: str | None = None


@dataclass(frozen=True)
class FailedCall:
    """A call that failed for good: after its last retry, or at once for a non-retryable error.
    ``error`` is ``"<ExceptionType>: <message>"``; ``status`` the last HTTP status, if any."""
    purpose: str
    where: str
    error: str
    attempts: int
    seconds: float
    status: int | None = None


class ModelCallError(RuntimeError):
    """Raised by :meth:`ChatClient.complete` (and returned by ``complete_many``) when a call fails;
    ``failure`` is the :class:`FailedCall` also appended to ``ChatClient.failures``."""

    def __init__(self, failure: FailedCall):
        self.failure = failure
        where = f" ({failure.where})" if failure.where else ""
        super().__init__(f"{failure.purpose}{where}: {failure.error} after {failure.attempts} attempt(s), "
                         f"{failure.seconds:.2f} s")


@dataclass(frozen=True)
class ChatStats:
    """Counters since the client was made: ``calls`` (complete() calls), ``requests`` (HTTP
    requests sent), ``cache_hits``, ``retries`` (requests beyond each call's first) and
    ``failures`` (calls that failed for good)."""
    calls: int
    requests: int
    cache_hits: int
    retries: int
    failures: int


# -- images -------------------------------------------------------------------------------------

def load_image(image: object, name: str = "image"):
    """A PIL RGB image from a PIL image, a uint8 ``[H, W]``, ``[H, W, 3]`` or ``[H, W, 4]`` array,
    or a file path. Unreadable files, zero-byte files and decompression bombs are a ValueError
    naming the file; other types a TypeError."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(image, Image.Image):
        return image if image.mode == "RGB" else image.convert("RGB")
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8:
            raise TypeError(f"{name}: expected a uint8 array, got dtype {image.dtype}")
        if image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[2] not in (3, 4)):
            raise ValueError(f"{name}: expected an array of shape [H, W], [H, W, 3] or [H, W, 4], got {list(image.shape)}")
        if image.shape[0] == 0 or image.shape[1] == 0:
            raise ValueError(f"{name}: expected a non-empty image, got shape {list(image.shape)}")
        return Image.fromarray(np.ascontiguousarray(image)).convert("RGB")
    if isinstance(image, (str, os.PathLike)):
        path = Path(image)
        if not path.is_file():
            raise ValueError(f"{name}: no such file {str(path)!r}")
        try:
            with Image.open(path) as im:
                im.load()
                return im.convert("RGB")
        except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
            raise ValueError(f"{name}: cannot read image file {str(path)!r} ({type(exc).__name__}: {exc})") from None
    raise TypeError(f"{name}: expected a PIL image, a uint8 array or a file path, got {type(image).__name__}")


def encode_image(image: object, max_side: int = DEFAULT_MAX_SIDE, name: str = "image") -> tuple[str, tuple[int, int]]:
    """``(data URL, (width, height) sent)``: the image downscaled to ``max_side`` (aspect kept,
    Lanczos), as a base64 JPEG data URL."""
    from PIL import Image

    _check_max_side(max_side)
    im = load_image(image, name)
    w, h = im.size
    if max(w, h) > max_side:
        scale = max_side / max(w, h)
        im = im.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.LANCZOS)
    buf = io.BytesIO()
    im.save(buf, format="JPEG", quality=JPEG_QUALITY)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii"), im.size


def image_part(image: object, max_side: int = DEFAULT_MAX_SIDE, name: str = "image") -> dict:
    """The OpenAI content part of one image: ``{"type": "image_url", "image_url": {"url": ...}}``."""
    url, _ = encode_image(image, max_side, name)
    return {"type": "image_url", "image_url": {"url": url}}


def _check_max_side(max_side: object) -> None:
    if isinstance(max_side, bool) or not isinstance(max_side, int) or max_side < 16:
        raise ValueError(f"max_side: expected an int >= 16 (pixels), got {max_side!r}")


# -- the client ---------------------------------------------------------------------------------

class ChatClient:
    """Chat completions with retries, a concurrency bound, a cache and a failure record.

    Args:
        base_url: the endpoint, e.g. ``"http://localhost:8000/v1"``.
        model: the model name it serves.
        api_key: sent as a bearer token (None: ``$OPENAI_API_KEY`` if set, else ``"unused"``, for
            local servers without auth).
        timeout: seconds per HTTP request (connect, read and write), > 0.
        max_retries: retries after the first request (>= 0): a call makes at most
            ``max_retries + 1`` requests.
        backoff: ``(base, factor, cap)`` seconds: the wait before retry ``n`` (1-based) is
            ``min(cap, base * factor ** (n - 1))`` times a jitter factor drawn uniformly from
            [0.5, 1.0] (so parallel callers spread out); a ``Retry-After`` (or
            ``retry-after-ms``) header raises the wait to what it asks, up to
            :data:`MAX_RETRY_AFTER` seconds.
        concurrency: the most HTTP requests in flight at once from this client (>= 1), and the
            thread count of :meth:`complete_many`.
        cache: a :class:`ResponseCache`, or None for no caching.
        temperature: sampling temperature (default 0: extraction wants repeatable answers).
        max_tokens: the reply length limit sent with each request (None: the server's default).

    Thread-safe: one client may serve many threads.
    """

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, timeout: float = 60.0,
                 max_retries: int = 3, backoff: tuple[float, float, float] = (0.5, 2.0, 8.0), concurrency: int = 4,
                 cache: ResponseCache | None = None, temperature: float = 0.0, max_tokens: int | None = None):
        for arg, value in (("base_url", base_url), ("model", model)):
            if not isinstance(value, str):
                raise TypeError(f"{arg}: expected str, got {type(value).__name__}")
            if not value.strip():
                raise ValueError(f"{arg}: expected a non-empty string, got {value!r}")
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url: expected an http:// or https:// URL, got {base_url!r}")
        if api_key is not None and not isinstance(api_key, str):
            raise TypeError(f"api_key: expected str or None, got {type(api_key).__name__}")
        if not _is_number(timeout) or not timeout > 0:
            raise ValueError(f"timeout: expected seconds > 0, got {timeout!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries: expected an int >= 0, got {max_retries!r}")
        if (not isinstance(backoff, (tuple, list)) or len(backoff) != 3 or not all(_is_number(b) for b in backoff)
                or backoff[0] < 0 or backoff[1] < 1 or backoff[2] < backoff[0]):
            raise ValueError(f"backoff: expected (base >= 0, factor >= 1, cap >= base) seconds, got {backoff!r}")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency: expected an int >= 1, got {concurrency!r}")
        if cache is not None and not isinstance(cache, ResponseCache):
            raise TypeError(f"cache: expected a ResponseCache or None, got {type(cache).__name__}")
        if not _is_number(temperature) or not 0 <= temperature <= 2:
            raise ValueError(f"temperature: expected a number in [0, 2], got {temperature!r}")
        _check_max_tokens(max_tokens)
        openai = _import_openai()
        self.base_url, self.model = base_url, model
        self.timeout, self.max_retries = float(timeout), max_retries
        self.backoff = tuple(float(b) for b in backoff)
        self.concurrency, self.cache = concurrency, cache
        self.temperature, self.max_tokens = float(temperature), max_tokens
        self._openai = openai
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY") or "unused"
        self._client = openai.OpenAI(base_url=base_url, api_key=key, timeout=self.timeout, max_retries=0)
        self._slots = threading.BoundedSemaphore(concurrency)
        self._lock = threading.Lock()
        self._failures: list[FailedCall] = []
        self._counts = {"calls": 0, "requests": 0, "cache_hits": 0, "retries": 0}

    def close(self) -> None:
        """Closes the HTTP connection pool (the client is unusable afterwards)."""
        self._client.close()

    def __enter__(self) -> ChatClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ChatClient({self.base_url!r}, {self.model!r}, concurrency={self.concurrency})"

    # -- bookkeeping ----------------------------------------------------------------------------

    @property
    def failures(self) -> list[FailedCall]:
        """Every call that failed for good, in the order they failed (a copy)."""
        with self._lock:
            return list(self._failures)

    @property
    def stats(self) -> ChatStats:
        with self._lock:
            return ChatStats(failures=len(self._failures), **self._counts)

    def _add(self, **counts: int) -> None:
        with self._lock:
            for key, n in counts.items():
                self._counts[key] += n

    def record_failure(self, purpose: str, where: str, error: str, attempts: int = 0, seconds: float = 0.0) -> FailedCall:
        """Records a failure that happened before any request (e.g. an unreadable image in a hook's
        batch), so that ``failures`` lists every input a batch could not process."""
        _check_label("purpose", purpose)
        _check_label("where", where)
        _check_label("error", error)
        failure = FailedCall(purpose, where, error, attempts, float(seconds))
        with self._lock:
            self._failures.append(failure)
        return failure

    def _fail(self, purpose: str, where: str, error: str, attempts: int, t0: float, status: int | None) -> ModelCallError:
        failure = FailedCall(purpose, where, error, attempts, time.perf_counter() - t0, status)
        with self._lock:
            self._failures.append(failure)
        return ModelCallError(failure)

    # -- calls ----------------------------------------------------------------------------------

    def params(self, max_tokens: int | None = None) -> dict:
        """The generation parameters of a request (part of the cache key)."""
        out: dict = {"temperature": self.temperature}
        limit = self.max_tokens if max_tokens is None else max_tokens
        if limit is not None:
            out["max_tokens"] = limit
        return out

    def complete(self, messages: list, *, purpose: str = "chat", where: str = "",
                 max_tokens: int | None = None) -> ChatReply:
        """One chat completion: the cache, else up to ``max_retries + 1`` requests.

        Raises:
            TypeError / ValueError: malformed ``messages`` (nothing is sent).
            ModelCallError: the call failed; the failure is also in :attr:`failures`.
        """
        _check_messages(messages)
        _check_label("purpose", purpose)
        _check_label("where", where)
        _check_max_tokens(max_tokens)
        params = self.params(max_tokens)
        t0 = time.perf_counter()
        self._add(calls=1)
        key = None
        if self.cache is not None:
            key = request_key(self.model, messages, params)
            hit = self.cache.get(key)
            if hit is not None:
                self._add(cache_hits=1)
                return ChatReply(hit.text, True, 0, time.perf_counter() - t0, hit.finish_reason)
        attempts, status = 0, None
        while True:
            attempts += 1
            self._add(requests=1, retries=int(attempts > 1))
            try:
                with self._slots:
                    reply = self._client.chat.completions.create(model=self.model, messages=messages, **params)
                text, finish = _reply_text(reply)
            except Exception as exc:  # every failure is classified, recorded, never lost
                status = getattr(exc, "status_code", None)
                retryable, wait = self._classify(exc)
                if not retryable or attempts > self.max_retries:
                    raise self._fail(purpose, where, f"{type(exc).__name__}: {_short(exc)}", attempts, t0,
                                     status) from exc
                time.sleep(max(wait, self._backoff(attempts)))
                continue
            if key is not None:
                try:
                    self.cache.put(key, text, model=self.model, finish_reason=finish, purpose=purpose)
                except OSError as exc:  # a full disk must not lose the answer we paid for
                    import warnings
                    warnings.warn(f"response cache: could not store a reply ({exc})", RuntimeWarning, stacklevel=2)
            return ChatReply(text, False, attempts, time.perf_counter() - t0, finish)

    def complete_many(self, requests: Sequence[ChatRequest]) -> list[ChatReply | ModelCallError]:
        """Runs `requests` on ``concurrency`` threads; results in request order, a failed call as
        its :class:`ModelCallError` (recorded in :attr:`failures` too) instead of raising.
        Malformed requests raise TypeError/ValueError before anything is sent."""
        if isinstance(requests, (str, bytes)) or not isinstance(requests, Sequence):
            raise TypeError(f"requests: expected a sequence of ChatRequest, got {type(requests).__name__}")
        for i, request in enumerate(requests):
            if not isinstance(request, ChatRequest):
                raise TypeError(f"requests[{i}]: expected a ChatRequest, got {type(request).__name__}")
            try:
                _check_messages(request.messages)
                _check_label("purpose", request.purpose)
                _check_label("where", request.where)
                _check_max_tokens(request.max_tokens)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"requests[{i}].{exc}") from None
        return run_parallel(self._one, list(requests), self.concurrency)

    def _one(self, request: ChatRequest) -> ChatReply | ModelCallError:
        try:
            return self.complete(request.messages, purpose=request.purpose, where=request.where,
                                 max_tokens=request.max_tokens)
        except ModelCallError as exc:
            return exc

    # -- retry policy ---------------------------------------------------------------------------

    def _classify(self, exc: Exception) -> tuple[bool, float]:
        """``(retryable, seconds the server asked us to wait)``."""
        openai = self._openai
        if isinstance(exc, openai.APIConnectionError):  # timeouts are a subclass
            return True, 0.0
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            if status in (408, 429) or status >= 500:
                return True, _retry_after(exc.response.headers)
        return False, 0.0

    def _backoff(self, attempt: int) -> float:
        base, factor, cap = self.backoff
        return min(cap, base * factor ** (attempt - 1)) * random.uniform(0.5, 1.0)


def run_parallel(fn, items: list, workers: int) -> list:
    """``[fn(x) for x in items]`` on up to `workers` threads, order kept (``fn`` must not raise)."""
    if len(items) <= 1 or workers == 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items)), thread_name_prefix="colgraph-chat") as pool:
        return list(pool.map(fn, items))


def _retry_after(headers) -> float:
    """Seconds from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date), capped."""
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return min(MAX_RETRY_AFTER, max(0.0, float(ms) / 1000.0))
        value = headers.get("retry-after")
        if value is None:
            return 0.0
        try:
            seconds = float(value)
        except ValueError:
            when = email.utils.parsedate_to_datetime(value)
            seconds = when.timestamp() - time.time()
        return min(MAX_RETRY_AFTER, max(0.0, seconds)) if seconds == seconds else 0.0
    except (TypeError, ValueError, OverflowError):  # a malformed header is ignored
        return 0.0


def _reply_text(reply) -> tuple[str, str | None]:
    choices = getattr(reply, "choices", None)
    if not choices:
        raise ValueError("malformed reply: no choices")
    message = getattr(choices[0], "message", None)
    content = getattr(message, "content", None)
    if content is not None and not isinstance(content, str):
        raise ValueError(f"malformed reply: content is {type(content).__name__}, expected a string")
    return content or "", getattr(choices[0], "finish_reason", None)


def _short(exc: Exception, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[:limit] + "..."


def _is_number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value == value and abs(value) != float("inf")


def _check_max_tokens(value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"max_tokens: expected an int >= 1 or None, got {value!r}")


def _check_label(name: str, value: object) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected str, got {type(value).__name__}")


def _check_messages(messages: object) -> None:
    if not isinstance(messages, list):
        raise TypeError(f"messages: expected a list of message dicts, got {type(messages).__name__}")
    if not messages:
        raise ValueError("messages: expected at least one message, got an empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise TypeError(f"messages[{i}]: expected a dict with 'role' and 'content', got {type(m).__name__}")
        if m.get("role") not in ROLES:
            raise ValueError(f"messages[{i}]['role']: expected one of {ROLES}, got {m.get('role')!r}")
        content = m.get("content")
        if isinstance(content, str):
            continue
        if not isinstance(content, list) or not content:
            raise TypeError(f"messages[{i}]['content']: expected a str or a non-empty list of content parts, "
                            f"got {type(content).__name__}")
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                continue
            if kind == "image_url" and isinstance(part.get("image_url"), dict) \
                    and isinstance(part["image_url"].get("url"), str):
                continue
            raise ValueError(f"messages[{i}]['content'][{j}]: expected {{'type': 'text', 'text': str}} or "
                             f"{{'type': 'image_url', 'image_url': {{'url': str}}}}, got {str(part)[:120]!r}")
