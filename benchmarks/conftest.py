"""pytest hooks for the CPU benchmarks: put the machine in the header and in the saved JSON.

CPU timings mean little without the CPU, the thread count and the library versions, so they
are printed before the run and stored with ``--benchmark-json`` / ``--benchmark-autosave``.
"""
import _impls


def pytest_report_header(config):
    info = _impls.machine_info()
    backends = info.pop("colgraph_backends")
    lines = [f"{k}: {v}" for k, v in info.items()]
    lines.append("colgraph backends: " + ", ".join(f"{k}={v}" for k, v in backends.items() if v not in (None, False)))
    return lines


def pytest_benchmark_update_machine_info(config, machine_info):
    machine_info["colgraph"] = _impls.machine_info()
