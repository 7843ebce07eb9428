"""The channel's handshake (:mod:`colgraph_engine.distributed.channel`) against peers that stay
silent, over real loopback sockets, without Ray: a silent peer does not stall a legitimate client
and is closed at the deadline, a server that never answers makes the client fall back instead of
hanging, a flood beyond the cap is closed at once, a wrong key is still refused, bad constructor
arguments are named."""
from __future__ import annotations

import logging
import math
import socket
import threading
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client

import pytest

from colgraph_engine.distributed.channel import ChannelServer, Channels, new_key

BOUND_S = 20.0  # generous: a hang is what these tests catch, not a speed


class Target:
    def __init__(self):
        self._lock = threading.RLock()

    def echo(self, x):
        return ("echo", x)


class Lost(RuntimeError):
    def __init__(self, shard, cause):
        super().__init__(f"shard {shard}: {type(cause).__name__}: {cause}")
        self.shard = shard


def bounded(fn, seconds=BOUND_S):
    """`fn()` on a daemon thread; its result, or a failure if it is still running after `seconds`."""
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still blocked after {seconds} s"
    if "error" in box:
        raise box["error"]
    return box["value"]


def silent_peer(address) -> tuple[socket.socket, bytes]:
    """A TCP connection that never answers; returns it with what the server sent first (its
    challenge when it admitted the peer, b"" when it closed it)."""
    sock = socket.create_connection(address, timeout=BOUND_S)
    try:
        first = sock.recv(4096)
    except ConnectionResetError:
        first = b""
    return sock, first


def still_open(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) != b""  # data would be a protocol surprise, but not a close
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.settimeout(BOUND_S)


def reads_eof(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def call_echo(address, key, x, **kw):
    ch = Channels(lambda i: (address, key), Lost, **kw)
    try:
        return ch.has(0), ch.call_many({0: ("echo", (x,))})
    finally:
        ch.close()


def test_a_silent_peer_does_not_stall_a_legitimate_client():
    key = new_key()
    srv = ChannelServer(Target(), ("echo",), key, "127.0.0.1", handshake_timeout=30.0)
    peer, first = silent_peer(srv.address)
    try:
        assert first  # admitted: the server waits for its answer to the challenge
        has, got = bounded(lambda: call_echo(srv.address, key, 7, connect_timeout=BOUND_S))
        assert has and got == {0: ("echo", 7)}
        assert still_open(peer)  # served while the silent peer is still in handshake
    finally:
        peer.close()
        srv.close()


def test_a_silent_peer_is_closed_at_the_deadline_and_served_connections_stay():
    key = new_key()
    srv = ChannelServer(Target(), ("echo",), key, "127.0.0.1", handshake_timeout=0.5)
    ch = Channels(lambda i: (srv.address, key), Lost)
    try:
        assert ch.has(0)  # completed before the deadline: its timer must not fire later
        peer, first = silent_peer(srv.address)
        with peer:
            assert first and reads_eof(peer, BOUND_S)
        assert ch.call_many({0: ("echo", ("after",))}) == {0: ("echo", "after")}
    finally:
        ch.close()
        srv.close()


def test_a_server_that_never_answers_makes_the_client_fall_back(caplog):
    mute = socket.create_server(("127.0.0.1", 0))  # the kernel completes connects; nobody speaks
    held = []
    threading.Thread(target=lambda: held.append(mute.accept()), daemon=True).start()
    ch = Channels(lambda i: (mute.getsockname(), new_key()), Lost, connect_timeout=0.5)
    try:
        with caplog.at_level(logging.WARNING, logger="colgraph_engine"):
            assert bounded(lambda: ch.has(0)) is False
        assert "no direct connection to shard 0" in caplog.text and "handshake" in caplog.text
        with pytest.raises(Lost, match="shard 0"):
            ch.call_many({0: ("echo", (1,))})
    finally:
        ch.close()
        for conn, _ in held:
            conn.close()
        mute.close()


def test_a_wrong_key_or_garbage_is_refused_and_the_server_keeps_serving():
    key = new_key()
    srv = ChannelServer(Target(), ("echo",), key, "127.0.0.1")
    try:
        with pytest.raises(AuthenticationError):
            bounded(lambda: Client(srv.address, authkey=new_key()))
        with pytest.raises(AuthenticationError):
            bounded(lambda: Channels(lambda i: (srv.address, new_key()), Lost).has(0))
        peer, first = silent_peer(srv.address)
        with peer:
            assert first
            peer.sendall(b"\x00\x00\x00\x10" + b"not a digest :-)")
            assert reads_eof(peer, BOUND_S)
        assert bounded(lambda: call_echo(srv.address, key, "ok")) == (True, {0: ("echo", "ok")})
    finally:
        srv.close()


def test_silent_peers_beyond_the_cap_are_closed_at_once_and_clients_get_served_again():
    key = new_key()
    srv = ChannelServer(Target(), ("echo",), key, "127.0.0.1", handshake_timeout=30.0, max_handshakes=4)
    handshaking = lambda: sum(t.name == "colgraph-channel" for t in threading.enumerate())  # noqa: E731
    before = handshaking()
    peers = [silent_peer(srv.address) for _ in range(12)]
    try:
        admitted = [p for p, first in peers if first]
        assert len(admitted) == 4  # the other 8 were closed on arrival
        assert all(reads_eof(p, BOUND_S) for p, first in peers if not first)
        assert handshaking() - before <= 4  # threads stay bounded by the cap
        # the cap is full: a client is closed at once (falls back), it does not wait 30 s
        full = Channels(lambda i: (srv.address, key), Lost, connect_timeout=BOUND_S)
        assert bounded(lambda: full.has(0)) is False
        for p in admitted:
            p.close()  # their handshakes end at once, freeing the cap

        def until_served():
            for _ in range(200):
                has, got = False, None
                try:
                    has, got = call_echo(srv.address, key, 2)
                except Lost:
                    pass
                if has:
                    return got
                threading.Event().wait(0.05)
            return None
        assert bounded(until_served) == {0: ("echo", 2)}
    finally:
        for p, _ in peers:
            p.close()
        srv.close()


@pytest.mark.parametrize("kw, error, match", [
    ({"handshake_timeout": 0}, ValueError, "handshake_timeout"),
    ({"handshake_timeout": math.nan}, ValueError, "handshake_timeout"),
    ({"handshake_timeout": math.inf}, ValueError, "handshake_timeout"),
    ({"handshake_timeout": "5"}, TypeError, "handshake_timeout"),
    ({"handshake_timeout": True}, TypeError, "handshake_timeout"),
    ({"max_handshakes": 0}, ValueError, "max_handshakes"),
    ({"max_handshakes": 2.0}, TypeError, "max_handshakes"),
])
def test_bad_server_arguments_are_named(kw, error, match):
    with pytest.raises(error, match=match):
        ChannelServer(Target(), ("echo",), new_key(), "127.0.0.1", **kw)


@pytest.mark.parametrize("value, error", [(-1, ValueError), (math.inf, ValueError), (None, TypeError)])
def test_bad_client_timeout_is_named(value, error):
    with pytest.raises(error, match="connect_timeout"):
        Channels(lambda i: None, Lost, connect_timeout=value)
