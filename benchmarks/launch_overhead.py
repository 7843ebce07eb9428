"""Host-side cost of one ``PackedStore.search`` call, without a GPU: the input to the CUDA-graphs
decision for the 1-query path (issue 14).

A CUDA graph replaces the launches of one call with one graph launch; it can only remove the
host's share of the latency. This measures that share on the CPU: the store's query path is
run on a CPU store with the Triton launch replaced by a no-op (the kernel is the device's
work, and the interpreter that would run it here is not representative), on data so small
that each torch op costs its dispatch, not its arithmetic. It counts the torch ops the path
issues (each is one kernel launch on a GPU) and times the whole path. The Triton launch's own
host cost is not measured here (it needs a driver); the GPU benchmark's ``store`` section
measures eager against graph replay on the device.

    .venv/bin/python benchmarks/launch_overhead.py      # writes results/launch_overhead.{md,json}
"""
from __future__ import annotations

import os

# The backend check admits CPU tensors to the Triton path only under the interpreter; the
# launch itself is replaced below, so nothing is interpreted.
os.environ["TRITON_INTERPRET"] = "1"

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as h  # noqa: E402
import colgraph_engine as cg  # noqa: E402
from colgraph_engine.kernels import maxsim as km  # noqa: E402


class CountOps(TorchFunctionMode):
    """Counts torch calls that return a tensor, by name: an upper bound on the launches the
    call makes on a GPU (some of them work on host tensors: the checks of CPU offsets and ids)."""

    def __init__(self):
        super().__init__()
        self.counts: dict[str, int] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        first = out[0] if isinstance(out, (tuple, list)) and out else out
        name = getattr(func, "__name__", repr(func))
        if isinstance(first, torch.Tensor) and name != "__get__":
            self.counts[name] = self.counts.get(name, 0) + 1
        return out


def main(argv=None) -> int:
    args = h.parser(__doc__, quick=False).parse_args(argv)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    d, n_docs, lq = 128, 1024, 32
    store = cg.PackedStore(d, torch.bfloat16)
    store.add([torch.randn(2, d, generator=g) for _ in range(n_docs)])  # 2 tokens: dispatch-bound ops
    store.snapshot().host()  # the host copies a first call makes
    q = torch.randn(lq, d, generator=g).to(torch.bfloat16)
    qo = torch.tensor([0, lq])
    launches = []

    def no_launch(*args, grid=None, **kwargs):  # the device's share: not timed here
        launches.append(grid)
    km._cross_kernel.run = no_launch
    km._candidates_kernel.run = no_launch
    rows = {}
    for name, call in (("search k=10", lambda: store.search(q, qo, k=10, backend="triton", assume_finite=True)),
                       ("score_candidates 64", lambda: store.score_candidates(
                           q, qo, torch.tensor([0, 64]), torch.arange(64), backend="triton", assume_finite=True))):
        call()
        launches.clear()
        with CountOps() as mode:
            call()
        n_launches = len(launches)
        t = h.stats(h.time_calls(call, 300, warmup=0))
        rows[name] = dict(call=name, torch_ops=sum(mode.counts.values()), triton_launches=n_launches, ops=mode.counts,
                          host_us_median=round(t["ms_median"] * 1e3, 1), host_us_min=round(t["ms_min"] * 1e3, 1))
    body = [f"{n_docs} documents, 1 query of {lq} tokens, bf16, d = {d}, 1 thread. "
            "`torch ops`: torch calls that return a tensor, an upper bound on the call's launches on a "
            "GPU (views and the checks of host offsets/ids launch nothing). Host µs: the whole call, "
            "Python included, this machine's CPU.", "",
            *h.table([("call", "call"), ("torch ops", "torch_ops"), ("Triton launches", "triton_launches"),
                      ("host µs (median)", "host_us_median"), ("host µs (min)", "host_us_min")], rows.values())]
    for n, r in rows.items():  # each call's torch ops by name
        body += ["", f"{n}: " + ", ".join(f"{k} {v}" for k, v in r["ops"].items())]
    h.write("launch_overhead", "Host cost of one store call (CPU, Triton launch replaced by a no-op)", body,
            {"rows": rows}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
