"""CPU MaxSim: colgraph_engine vs colpali-engine vs plain torch, on the same inputs.

Run::

    .venv/bin/python -m pytest benchmarks/test_cpu_maxsim.py --benchmark-only -q

One benchmark group per case (shape x dtype), so pytest-benchmark's table shows each row's
time relative to the fastest of its group. Cases (see ``_data.CASES``):

* cross: Nq=8 queries x Lq=32 tokens against Nd=512 docs x Ld=1030 tokens, d=128 -> ``[Nq, Nd]``
  scores, store in fp32 and in bf16;
* topk: the same queries against Nd=20000 docs x Ld=128 tokens -> exact top-10
  ``(scores [Nq, 10], indices [Nq, 10])``, fp32 and bf16.

Before a row is timed its result is checked against fp64 (``_impls.check``), so a wrong
implementation fails instead of being timed.
"""
import pytest

import _data
import _impls

# Rounds are few on purpose: one call of a top-k case does about 84 GFLOP and the whole suite
# should stay within a few minutes on a 2-core machine.
ROUNDS = {"cross": 5, "topk": 3}


def _params():
    for case in _data.CASES:
        for name in _impls.impl_names(case):
            yield pytest.param(case, name, id=f"{case.kind}-{case.dtype_name}-{name.replace(' ', '_')}",
                               marks=pytest.mark.benchmark(group=case.name))


@pytest.mark.parametrize(("case", "name"), list(_params()))
def test_maxsim_cpu(benchmark, case, name):
    reason = _impls.skip_reason(name)
    if reason:
        pytest.skip(reason)
    data = _data.make_data(case)
    fn = _impls.build(name, data)
    err = _impls.check(name, data, fn())  # raises CorrectnessError before any timing
    benchmark.extra_info.update(gflop=case.flops / 1e9, dtype=case.dtype_name, max_abs_err=err)
    benchmark.pedantic(fn, rounds=ROUNDS[case.kind], iterations=1, warmup_rounds=1)
