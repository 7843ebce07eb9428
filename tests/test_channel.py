"""The direct driver-to-shard connections (:mod:`colgraph_engine.distributed.channel`) over real
loopback sockets, without Ray: answers in shard order, errors raised after every answer is in
with the connections kept in step, a peer without the key refused, unknown methods refused, a
timed-out or broken connection named as its shard and replaced on the next call."""
from __future__ import annotations

import threading
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client

import numpy as np
import pytest

from colgraph_engine.distributed.channel import ChannelServer, Channels, new_key


class Target:
    def __init__(self, name):
        self._lock = threading.RLock()
        self.name = name
        self.calls = 0

    def echo(self, x):
        self.calls += 1
        return self.name, x

    def fail(self, why):
        raise ValueError(f"{self.name}: {why}")

    def slow(self, seconds):
        time.sleep(seconds)
        return self.name

    def hidden(self):
        return "never served"


class Lost(RuntimeError):
    def __init__(self, shard, cause):
        super().__init__(f"shard {shard}: {type(cause).__name__}: {cause}")
        self.shard = shard


@pytest.fixture()
def servers():
    key = new_key()
    targets = [Target(f"s{i}") for i in range(3)]
    srv = [ChannelServer(t, ("echo", "fail", "slow"), key, "127.0.0.1") for t in targets]
    yield key, targets, srv
    for s in srv:
        s.close()


def test_calls_answer_in_shard_order_and_errors_keep_connections_in_step(servers):
    key, targets, srv = servers
    connects = []
    ch = Channels(lambda i: connects.append(i) or (srv[i].address, key), Lost)
    assert all(ch.has(i) for i in range(3)) and connects == [0, 1, 2]
    arr = np.arange(12.0).reshape(3, 4)
    got = ch.call_many({2: ("echo", (arr,)), 0: ("echo", ("a",)), 1: ("echo", ({"k": 1},))})
    assert list(got) == [2, 0, 1] and got[0] == ("s0", "a") and got[1] == ("s1", {"k": 1})
    assert got[2][0] == "s2" and np.array_equal(got[2][1], arr)
    # one shard's error is raised once all answers are in; the next call reads its own answers
    with pytest.raises(ValueError, match="s1: bad"):
        ch.call_many({0: ("echo", (1,)), 1: ("fail", ("bad",)), 2: ("echo", (2,))})
    assert ch.call_many({0: ("echo", (3,)), 1: ("echo", (4,)), 2: ("echo", (5,))}) == {
        0: ("s0", 3), 1: ("s1", 4), 2: ("s2", 5)}
    with pytest.raises(ValueError, match="'hidden' is not served"):
        ch.call_many({0: ("hidden", ())})
    assert ch.call_many({0: ("echo", (6,))}) == {0: ("s0", 6)}
    assert connects == [0, 1, 2]  # no reconnects: nothing broke
    ch.close()


def test_a_peer_without_the_key_is_refused_and_the_server_keeps_serving(servers):
    key, _, srv = servers
    with pytest.raises(AuthenticationError):
        Client(srv[0].address, authkey=new_key())
    ch = Channels(lambda i: (srv[i].address, key), Lost)
    assert ch.has(0) and ch.call_many({0: ("echo", ("after",))}) == {0: ("s0", "after")}
    ch.close()


def test_a_timeout_or_a_broken_connection_names_the_shard_and_the_next_call_reconnects(servers):
    key, targets, srv = servers
    connects = []
    ch = Channels(lambda i: connects.append(i) or (srv[i].address, key), Lost)
    for i in range(3):
        ch.has(i)
    with pytest.raises(Lost, match="shard 1: TimeoutError") as err:
        ch.call_many({0: ("echo", (1,)), 1: ("slow", (0.5,)), 2: ("echo", (2,))}, timeout=0.05)
    assert err.value.shard == 1
    # the late answer of shard 1 is never read: its connection was dropped, the next call reconnects
    assert ch.call_many({1: ("echo", ("fresh",))}) == {1: ("s1", "fresh")}
    assert connects.count(1) == 2 and connects.count(0) == 1
    ch.close()


SERVE = """
import sys, threading, time
from colgraph_engine.distributed.channel import ChannelServer
class T:
    _lock = threading.RLock()
    def echo(self, x):
        return x
srv = ChannelServer(T(), ("echo",), bytes.fromhex(sys.argv[1]), "127.0.0.1")
print(srv.address[1], flush=True)
time.sleep(600)
"""


def test_a_server_process_that_dies_is_named_and_the_others_go_on(servers):
    """A real process serving a channel is killed (as a shard actor's process would be): the
    call to it raises the shard's error, the other shards' answers are unaffected."""
    import subprocess
    import sys
    key, _, srv = servers
    proc = subprocess.Popen([sys.executable, "-c", SERVE, key.hex()], stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        addrs = {0: srv[0].address, 1: ("127.0.0.1", port)}
        ch = Channels(lambda i: (addrs[i], key), Lost)
        assert ch.has(0) and ch.has(1)
        assert ch.call_many({0: ("echo", (1,)), 1: ("echo", (2,))}) == {0: ("s0", 1), 1: 2}
        proc.kill()
        proc.wait(timeout=30)
        with pytest.raises(Lost, match="shard 1") as err:
            ch.call_many({0: ("echo", (3,)), 1: ("echo", (4,))})
        assert err.value.shard == 1
        assert ch.call_many({0: ("echo", (5,))}) == {0: ("s0", 5)}
        ch.close()
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_a_shard_that_cannot_be_reached_falls_back():
    def refuse(i):
        raise ConnectionRefusedError("nobody listens")
    ch = Channels(refuse, Lost)
    assert ch.has(0) is False and ch.has(0) is False  # tried once, then remembered
    assert Channels(lambda i: None, Lost).has(3) is False  # a shard serving no channel
