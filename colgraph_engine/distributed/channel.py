"""Direct connections from the driver to the shard actors, for the query path's small calls.

**Why.** A Ray actor call costs about 1 ms on this project's machine (two shards called in
parallel with 4 KiB out and 11 KiB back: 1.08 ms p50): the call passes the driver's core worker,
the actor's task queue and the reply path of Ray's object layer. A query makes one round of
such calls (stage 1, with the shipped documents), sometimes two (the gather). A connection of our
own to each actor (:mod:`multiprocessing.connection` over TCP to the actor's node address,
authenticated by an HMAC challenge on a random key handed over through Ray) carries the same
round in 0.09-0.14 ms. Ray keeps everything else: it starts, places, restarts and kills the
actors, and carries writes, rebalancing moves and every large transfer (rows as bytes go through
its object store, uncopied).

**Server** (:class:`ChannelServer`, in the actor): a listener thread and one thread per
connection; a request ``(method, args)`` names a method of the served object from an allowed
set and is answered ``("ok", result)`` or ``("error", exception)``. Calls run under the served
object's lock, so they never interleave with the Ray calls the actor's main thread runs.
Waiting threads block in ``recv``: an idle connection costs no CPU (Ray's compiled graphs, the
other way to cut the call cost, poll their channels: about one core per idle actor here, which a
2-core machine cannot spare).

**Client** (:class:`Channels`, in the driver): one connection per shard. :meth:`Channels.call_many`
sends every request first and then reads every answer, so each connection stays in step even when
an answer is an error (which is raised after all answers are in). A connection that breaks or
does not answer within the timeout is closed (a late answer would otherwise be read as the next
call's) and reported as :class:`~.corpus.ShardUnavailableError` naming the shard.
"""
from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from multiprocessing.connection import Client, Connection, Listener

log = logging.getLogger("colgraph_engine")


class ChannelServer:
    """Serves `methods` of `target` over authenticated connections on `host` (any free port).

    Args:
        target: the served object; it must have a ``_lock`` (a ``threading.RLock``) that its
            other entry points hold too.
        methods: the names a request may call.
        authkey: the shared key (HMAC challenge on connect; a peer without it is refused).
        host: the address to listen on (the actor's node address).
    """

    def __init__(self, target, methods: Iterable[str], authkey: bytes, host: str):
        self.target, self.methods = target, frozenset(methods)
        self.listener = Listener((host, 0), authkey=authkey)
        self.address = self.listener.address
        self._closed = False
        threading.Thread(target=self._accept, name="colgraph-channel-accept", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn = self.listener.accept()
            except Exception:  # noqa: BLE001 - closed (stop), or a peer that failed the challenge (go on)
                if self._closed:
                    return
                continue
            threading.Thread(target=self._serve, args=(conn,), name="colgraph-channel", daemon=True).start()

    def _serve(self, conn: Connection) -> None:
        with conn:
            while True:
                try:
                    method, args = conn.recv()
                except (EOFError, OSError):
                    return
                try:
                    if method not in self.methods:
                        raise ValueError(f"method: {method!r} is not served over the channel")
                    with self.target._lock:  # noqa: SLF001 - the served object's own lock
                        reply = ("ok", getattr(self.target, method)(*args))
                except Exception as exc:  # noqa: BLE001 - sent back, raised in the driver
                    reply = ("error", exc)
                try:
                    conn.send(reply)
                except (OSError, ValueError):
                    return
                except Exception as exc:  # noqa: BLE001 - an answer that does not pickle
                    conn.send(("error", RuntimeError(f"{method}: its answer could not be sent ({exc!r})")))

    def close(self) -> None:
        self._closed = True
        self.listener.close()


class Channels:
    """The driver's connections, one per shard (made on first use by `connect(shard)`, which
    returns ``(address, authkey)`` or None when the shard serves no channel).

    Args:
        connect: ``callable(shard) -> (address, authkey) | None``.
        unavailable: ``callable(shard, cause) -> Exception`` the error raised for a shard whose
            connection broke or timed out.
    """

    def __init__(self, connect: Callable[[int], tuple | None], unavailable: Callable[[int, BaseException], Exception]):
        self._connect, self._unavailable = connect, unavailable
        self._conns: dict[int, Connection | None] = {}

    def has(self, shard: int) -> bool:
        """Whether calls to `shard` go over a connection (connecting now if not tried yet; a
        shard whose address cannot be reached from here falls back to Ray calls)."""
        if shard not in self._conns:
            conn = None
            try:
                got = self._connect(shard)
                if got is not None:
                    conn = Client(got[0], authkey=got[1])
            except OSError as exc:  # e.g. the actor's node is not reachable from the driver
                log.warning("colgraph_engine: no direct connection to shard %d (%s); using Ray calls", shard, exc)
            self._conns[shard] = conn
        return self._conns[shard] is not None

    def call_many(self, calls: dict[int, tuple[str, tuple]], timeout: float | None = None) -> dict:
        """``{shard: result}`` of ``{shard: (method, args)}`` (connecting where needed): all
        sent, then all read. The first failure is raised once every answer is
        in: a broken or timed-out connection as `unavailable`, an error the method raised as
        itself."""
        failures: dict[int, BaseException] = {}
        for s, (method, args) in calls.items():
            if not self.has(s):
                failures[s] = self._unavailable(s, ConnectionError("no direct connection"))
                continue
            try:
                self._conns[s].send((method, args))
            except (OSError, ValueError) as exc:
                failures[s] = self._broken(s, exc)
        out = {}
        deadline = None if timeout is None else time.monotonic() + timeout
        for s in calls:
            if s in failures:
                continue
            conn = self._conns[s]
            try:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if left is not None and not conn.poll(left):
                    raise TimeoutError(f"no answer within {timeout} s")
                status, value = conn.recv()
            except (EOFError, OSError, TimeoutError) as exc:
                failures[s] = self._broken(s, exc)
                continue
            if status == "ok":
                out[s] = value
            else:
                failures[s] = value
        if failures:
            raise failures[min(failures)]
        return out

    def _broken(self, shard: int, cause: BaseException) -> Exception:
        self.drop(shard)  # the next call reconnects (a restarted actor serves anew)
        return self._unavailable(shard, cause)

    def drop(self, shard: int) -> None:
        """Closes the shard's connection (its actor restarts or stops); the next call reconnects."""
        conn = self._conns.pop(shard, None)
        if conn is not None:
            try:
                conn.close()
            except OSError:
                pass

    def close(self) -> None:
        for s in list(self._conns):
            self.drop(s)


def new_key() -> bytes:
    return secrets.token_bytes(32)


__all__ = ["ChannelServer", "Channels", "new_key"]
