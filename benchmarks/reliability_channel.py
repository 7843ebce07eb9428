"""Reliability reproducer for the shard channel's handshake (issue 22, item 7).

Starts a :class:`~colgraph_engine.distributed.channel.ChannelServer` on loopback, opens N TCP
connections that never answer the challenge, then times a legitimate :class:`Channels` client's
first call (connect, handshake, one ``echo``). Before the fix the server ran the handshake on its
accept thread with no deadline, so one silent peer stalled every later client; the client had no
timeout either, so the call is run on a thread and given up after ``--bound`` seconds.

Usage: ``python benchmarks/reliability_channel.py [--peers 1 64 200] [--bound 10]
[--module PATH]`` (``--module``: a copy of another ``channel.py``, e.g. the code before the fix,
imported by path). Prints one JSON row per peer count.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import socket
import threading
import time


class Target:
    def __init__(self):
        self._lock = threading.RLock()

    def echo(self, x):
        return x


class Lost(RuntimeError):
    def __init__(self, shard, cause):
        super().__init__(f"shard {shard}: {cause!r}")


def load(path: str | None):
    if path is None:
        from colgraph_engine.distributed import channel
        return channel
    spec = importlib.util.spec_from_file_location("channel_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def measure(channel, peers: int, bound: float) -> dict:
    key = channel.new_key()
    srv = channel.ChannelServer(Target(), ("echo",), key, "127.0.0.1")
    silent = []
    for _ in range(peers):  # the old listener's backlog was 1: later connects time out
        try:
            silent.append(socket.create_connection(srv.address, timeout=2.0))
        except OSError:
            break
    time.sleep(0.2)  # let the server accept them
    box = {}

    def legit():
        ch = channel.Channels(lambda i: (srv.address, key), Lost)
        try:
            box["has"] = ch.has(0)
            box["value"] = ch.call_many({0: ("echo", (42,))})[0] if box["has"] else None
        except Exception as exc:  # noqa: BLE001 - reported as the outcome
            box["error"] = repr(exc)
        finally:
            ch.close()

    start = time.perf_counter()
    t = threading.Thread(target=legit, daemon=True)
    t.start()
    t.join(bound)
    wait = time.perf_counter() - start
    if t.is_alive():
        outcome = f"blocked (gave up after {bound:g} s)"
    elif box.get("value") == 42:
        outcome = "answered 42 over the channel"
    elif "error" in box:
        outcome = f"error: {box['error']}"
    else:
        outcome = "no channel: fell back to Ray calls"
    for s in silent:
        s.close()
    srv.close()
    return {"silent_peers": peers, "connected": len(silent), "legit_wait_s": round(wait, 4), "outcome": outcome}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", type=int, nargs="+", default=[1, 64, 200])
    ap.add_argument("--bound", type=float, default=10.0)
    ap.add_argument("--module", default=None)
    args = ap.parse_args()
    channel = load(args.module)
    for n in args.peers:
        row = measure(channel, n, args.bound)
        print(json.dumps({"module": args.module or "colgraph_engine.distributed.channel", **row}), flush=True)


if __name__ == "__main__":
    main()
