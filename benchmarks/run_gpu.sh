#!/usr/bin/env bash
# Runs benchmarks/gpu_maxsim.py (default) or benchmarks/gpu_pipeline.py (--pipeline) on a lent
# GPU machine, from a plain copy of this repository, one script at a time with all its sections.
# For the headline figures in ONE device call (all three, each with its share of <= 9 minutes, the
# native module built there) use benchmarks/gpu_all.sh instead (benchmarks/README.md, "One GPU run").
#
#   bash benchmarks/run_gpu.sh [--smoke]                 # MaxSim kernels vs peers: up to ~8 min
#   bash benchmarks/run_gpu.sh --pipeline [ARGS...]      # the retrieval pipeline at 10k documents: ~4-7 min
#   bash benchmarks/run_gpu.sh --prefilter [ARGS...]     # prefilter vs exact and fast-plaid: ~5-8 min
#
# Results in $GPU_OUT, else $OUT, else benchmarks/results. Each is one device call of its own:
# together they would pass the device's 10-minute limit per command. Give --pipeline a
# timeout_s of 600; its own budget (--budget-s, default 480 s) shortens the CPU side-by-side
# runs when the index build was slow. ARGS go to gpu_pipeline.py (e.g. --docs 2000).
#
# Nothing is built: the C++ extension colgraph_engine._core is optional, and the benchmark
# only needs the Python package and the Triton kernels. Peers come as wheels in .whl/
# (git-ignored; see /work/shared/bench/README.md for the download line); without them the
# peers are skipped and recorded as such. Extra environment: GPU_BUDGET_S (default 420),
# SECTIONS (comma list), PYTHON (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PY=${PYTHON:-python3}

# 1. Peers' wheels, installed without network or dependencies into a throwaway target.
SITE=/tmp/site
if compgen -G ".whl/*.whl" > /dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl \
        || echo "run_gpu.sh: installing .whl/*.whl failed; peers that need them will be skipped" >&2
else
    echo "run_gpu.sh: no wheels in .whl/; peers will be skipped" >&2
fi

# 2. colgraph_engine from the source tree. The wheel ships the top-level kernels/ as
# colgraph_engine/kernels (pyproject: wheel.packages), so a bare checkout on PYTHONPATH lacks
# colgraph_engine.kernels. Rather than alias modules inside the script (which would load the
# kernel module twice under two names, each with its own JIT and autotune cache), build the
# installed layout with symlinks in a temporary directory: every entry of colgraph_engine/,
# plus kernels/ under the name the wheel gives it. Imports then behave as in the wheel.
SRC=$(mktemp -d /tmp/colgraph_src.XXXXXX)
mkdir "$SRC/colgraph_engine"
for entry in "$REPO"/colgraph_engine/*; do
    ln -s "$entry" "$SRC/colgraph_engine/"
done
ln -s "$REPO/kernels" "$SRC/colgraph_engine/kernels"
export PYTHONPATH="$SRC:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export COLGRAPH_DISABLE_NATIVE=1  # not built here; say so instead of failing an import

export GPU_OUT=${GPU_OUT:-${OUT:-$REPO/benchmarks/results}}
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available())"

# 3. The script. --pipeline: the graph stays on the CPU, on the numpy reference backend (the
# native module is not built here), and the CPU side of the comparison uses torch's MaxSim.
if [ "${1:-}" = "--prefilter" ]; then
    shift
    export PYTHONUNBUFFERED=1
    exec "$PY" benchmarks/gpu_prefilter.py "$@"
fi
if [ "${1:-}" = "--pipeline" ]; then
    shift
    export PYTHONUNBUFFERED=1
    exec "$PY" benchmarks/gpu_pipeline.py --out "$GPU_OUT" "$@"
fi
exec "$PY" benchmarks/gpu_maxsim.py "$@"
