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

**Server** (:class:`ChannelServer`, in the actor): a listener thread that only accepts, and one
thread per connection, which first runs the HMAC handshake (the same challenge as
:class:`multiprocessing.connection.Listener` with an ``authkey``, so plain ``Client`` peers work)
under a deadline (:data:`HANDSHAKE_TIMEOUT_S`) and then serves. The handshake is off the listener
thread and bounded in time so that one peer which connects and stays silent cannot stall every
later client; at most :data:`MAX_HANDSHAKES` connections may be in handshake at once (beyond that
a new connection is closed at once), so a flood of silent peers cannot exhaust threads. A request
``(method, args)`` names a method of the served object from an allowed set and is answered
``("ok", result)`` or ``("error", exception)``. Calls run under the served object's lock, so
they never interleave with the Ray calls the actor's main thread runs.
Waiting threads block in ``recv``: an idle connection costs no CPU (Ray's compiled graphs, the
other way to cut the call cost, poll their channels: about one core per idle actor here, which a
2-core machine cannot spare).

**Client** (:class:`Channels`, in the driver): one connection per shard, connected and
authenticated within a timeout (a shard that does not complete it in time is treated as
unreachable: its calls go through Ray). :meth:`Channels.call_many` sends every request first
and then reads every answer, so each connection stays in step even when an answer is an error
(which is raised after all answers are in). A connection that breaks or
does not answer within the timeout is closed (a late answer would otherwise be read as the next
call's) and reported as :class:`~.corpus.ShardUnavailableError` naming the shard.
"""
from __future__ import annotations

import logging
import math
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge

log = logging.getLogger("colgraph_engine")

HANDSHAKE_TIMEOUT_S = 5.0
"""Seconds a peer has to connect and complete the HMAC handshake (server and client default)."""
MAX_HANDSHAKES = 64
"""Connections a server keeps in handshake at once; beyond that a new connection is closed."""


def _check_timeout(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected a number of seconds, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}: expected a finite number of seconds > 0, got {value!r}")
    return float(value)


class _Deadline:
    """Shuts `conn`'s socket down after `seconds` unless :meth:`cancel` comes first.

    A :class:`Connection` reads with ``os.read`` on its descriptor, so socket timeouts do not
    apply to it; shutting the socket down (through a duplicate of the descriptor) wakes a read
    blocked on it with end of file. The lock makes expiry and cancel exclusive, so the socket is
    never touched after the caller has moved on (and may have closed it)."""

    def __init__(self, conn: Connection, seconds: float):
        self._conn, self._lock, self._done, self.expired = conn, threading.Lock(), False, False
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon, self._timer.name = True, "colgraph-channel-deadline"
        self._timer.start()

    def _expire(self) -> None:
        with self._lock:
            if self._done:
                return
            self.expired = True
            try:
                with socket.socket(fileno=os.dup(self._conn.fileno())) as sock:
                    sock.shutdown(socket.SHUT_RDWR)
            except OSError as exc:  # already closed by the peer, or no descriptor left to dup
                log.debug("colgraph_engine: channel handshake deadline: shutdown failed (%r)", exc)

    def cancel(self) -> bool:
        """Stops the timer; returns whether it had already fired."""
        with self._lock:
            self._done = True
        self._timer.cancel()
        return self.expired


def _handshake(conn: Connection, authkey: bytes, timeout: float, *, server: bool) -> None:
    """The HMAC challenge both ways (the order of ``Listener.accept`` on the server and of
    ``Client`` on the client), given up after `timeout` seconds as :class:`TimeoutError`. A peer
    that closes meanwhile raises :class:`ConnectionError`; a wrong key raises
    :class:`multiprocessing.AuthenticationError`."""
    steps = (deliver_challenge, answer_challenge) if server else (answer_challenge, deliver_challenge)
    deadline = _Deadline(conn, timeout)
    cause = None
    try:
        for step in steps:
            step(conn, authkey)
    except (EOFError, OSError) as exc:
        cause = exc
    finally:
        expired = deadline.cancel()
    if expired:  # even when the steps passed: the socket is shut down now
        raise TimeoutError(f"handshake not completed within {timeout} s") from cause
    if cause is not None:
        raise ConnectionError(f"connection closed during the handshake ({cause!r})") from cause


def _dial(address, authkey: bytes, timeout: float) -> Connection:
    """A connection to a :class:`ChannelServer` at `address`, connected and authenticated within
    `timeout` seconds in all (else :class:`TimeoutError`)."""
    start = time.monotonic()
    with socket.create_connection(tuple(address), timeout=timeout) as sock:
        sock.setblocking(True)  # Connection does blocking os.read/os.write on the descriptor
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # see ChannelServer._admit
        conn = Connection(sock.detach())
    try:
        left = timeout - (time.monotonic() - start)
        if left <= 0:
            raise TimeoutError(f"connect took longer than {timeout} s")
        _handshake(conn, authkey, left, server=False)
    except BaseException:
        conn.close()
        raise
    return conn


class ChannelServer:
    """Serves `methods` of `target` over authenticated connections on `host` (any free port).

    Args:
        target: the served object; it must have a ``_lock`` (a ``threading.RLock``) that its
            other entry points hold too.
        methods: the names a request may call.
        authkey: the shared key (HMAC challenge on connect; a peer without it is refused).
        host: the address to listen on (the actor's node address).
        handshake_timeout: seconds a new connection has to complete the challenge before it is
            closed.
        max_handshakes: connections allowed in handshake at once; more are closed on arrival.
    """

    def __init__(self, target, methods: Iterable[str], authkey: bytes, host: str, *,
                 handshake_timeout: float = HANDSHAKE_TIMEOUT_S, max_handshakes: int = MAX_HANDSHAKES):
        if not isinstance(authkey, bytes):
            raise TypeError(f"authkey: expected bytes, got {type(authkey).__name__}")
        self.handshake_timeout = _check_timeout("handshake_timeout", handshake_timeout)
        if isinstance(max_handshakes, bool) or not isinstance(max_handshakes, int):
            raise TypeError(f"max_handshakes: expected an int, got {type(max_handshakes).__name__}")
        if max_handshakes < 1:
            raise ValueError(f"max_handshakes: expected at least 1, got {max_handshakes}")
        self.max_handshakes = max_handshakes
        self.target, self.methods, self._authkey = target, frozenset(methods), authkey
        self._sock = socket.create_server((host, 0), family=socket.AF_INET)
        self.address = self._sock.getsockname()[:2]
        self._closed = False
        self._pending, self._pending_lock = 0, threading.Lock()
        threading.Thread(target=self._accept, name="colgraph-channel-accept", daemon=True).start()

    def _accept(self) -> None:
        """Accepts only: every handshake runs on its connection's own thread."""
        while True:
            try:
                sock, peer = self._sock.accept()
            except OSError as exc:
                if self._closed:
                    return
                log.debug("colgraph_engine: channel accept failed (%r)", exc)
                time.sleep(0.01)  # e.g. out of descriptors: do not spin
                continue
            with self._pending_lock:
                admit = self._pending < self.max_handshakes
                self._pending += admit
            if not admit:
                log.debug("colgraph_engine: channel peer %s closed: %d handshakes pending", peer, self.max_handshakes)
                sock.close()
                continue
            try:
                threading.Thread(target=self._admit, args=(sock, peer), name="colgraph-channel", daemon=True).start()
            except RuntimeError as exc:  # no thread to be had
                log.debug("colgraph_engine: channel peer %s closed: %r", peer, exc)
                self._handshake_done()
                sock.close()

    def _handshake_done(self) -> None:
        with self._pending_lock:
            self._pending -= 1

    def _admit(self, sock: socket.socket, peer) -> None:
        """The handshake (within :attr:`handshake_timeout`), then serving; a failure only closes
        this connection."""
        conn = None
        try:
            sock.setblocking(True)  # Connection does blocking os.read/os.write on the descriptor
            # small messages go out at once: without it the client's last handshake message and
            # its first request, written back to back, wait for a delayed ACK (~40 ms)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = Connection(sock.detach())
            _handshake(conn, self._authkey, self.handshake_timeout, server=True)
        except Exception as exc:  # noqa: BLE001 - wrong key, garbage, silence, a closed peer
            log.debug("colgraph_engine: channel peer %s refused (%r)", peer, exc)
            if conn is None:
                sock.close()
            else:
                conn.close()
            return
        finally:
            self._handshake_done()
        self._serve(conn)

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
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept (Linux)
        except OSError:
            pass
        self._sock.close()


class Channels:
    """The driver's connections, one per shard (made on first use by `connect(shard)`, which
    returns ``(address, authkey)`` or None when the shard serves no channel).

    Args:
        connect: ``callable(shard) -> (address, authkey) | None``.
        unavailable: ``callable(shard, cause) -> Exception`` the error raised for a shard whose
            connection broke or timed out.
        connect_timeout: seconds to connect to a shard and complete the handshake; a shard
            that takes longer is treated as unreachable (its calls go through Ray).
    """

    def __init__(self, connect: Callable[[int], tuple | None], unavailable: Callable[[int, BaseException], Exception],
                 connect_timeout: float = HANDSHAKE_TIMEOUT_S):
        self._connect, self._unavailable = connect, unavailable
        self.connect_timeout = _check_timeout("connect_timeout", connect_timeout)
        self._conns: dict[int, Connection | None] = {}

    def has(self, shard: int) -> bool:
        """Whether calls to `shard` go over a connection (connecting now if not tried yet; a
        shard whose address cannot be reached from here, or that does not complete the
        handshake within :attr:`connect_timeout`, falls back to Ray calls)."""
        if shard not in self._conns:
            conn = None
            try:
                got = self._connect(shard)
                if got is not None:
                    conn = _dial(got[0], got[1], self.connect_timeout)
            except OSError as exc:  # unreachable node, refused, closed or silent in the handshake
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


__all__ = ["HANDSHAKE_TIMEOUT_S", "MAX_HANDSHAKES", "ChannelServer", "Channels", "new_key"]
