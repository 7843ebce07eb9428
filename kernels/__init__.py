"""Triton kernels of colgraph_engine (installed as ``colgraph_engine.kernels``).

Launchers here do no validation: the public functions in ``colgraph_engine.ops`` do it.
"""
