#!/usr/bin/env bash
# The one prepared GPU run: every headline figure in one device call of at most 9 minutes
# (benchmarks/gpu_headline.py says what runs, in which order, with which time budgets).
#
#   bash benchmarks/gpu_all.sh            # on the GPU machine; carry gpu_bundle/ (scripts/gpu_bundle.sh)
#   bash benchmarks/gpu_all.sh --quick    # on a CPU: every phase at tiny shapes, Triton interpreted
#
# Results in $OUT when set (the device's), else benchmarks/results: gpu_headline{,_quick}.md/.json,
# gpu_headline_{maxsim,prefilter,pipeline}{,_quick}.md and gpu_all{,_quick}.log. Other arguments go to
# gpu_headline.py (--only, --budget-s, --pipeline-docs, --pipeline-images, --bundle, --out).
# PYTHON picks the interpreter: default python3 on the device, the repository's .venv here.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
for a in "$@"; do
    # The interpreter must be chosen before torch and triton are imported, in every phase.
    [ "$a" = "--quick" ] && export TRITON_INTERPRET=1
done
exec "$PY" benchmarks/gpu_headline.py --python "$(command -v "$PY")" "$@"
