#!/usr/bin/env bash
# One-step set-up on a fresh Debian machine (run as root, or with sudo available):
# system packages, a virtual environment in .venv, and colgraph_engine installed editable.
#   bash scripts/setup.sh          # the engine, its demo and the main job: the PDF reader, OCR, the
#                                  # offline models (the default encoders of a new index), the model
#                                  # hooks' client and the HTTP service
#   bash scripts/setup.sh --test   # ... plus Ray (sharded retrieval) and the test tools
#   bash scripts/setup.sh --bench  # ... plus the benchmark peers (scipy, networkx, matplotlib)
set -euo pipefail
cd "$(dirname "$0")/.."

main="models,llm,serve"
extras="[$main]"
case "${1:-}" in
  --test) extras="[$main,distributed,test]" ;;
  --bench) extras="[$main,distributed,test,bench]" ;;
  "") ;;
  *) echo "usage: $0 [--test|--bench]" >&2; exit 2 ;;
esac

sudo_cmd=""
[ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
if ! pkg-config --exists igraph 2>/dev/null || ! command -v cmake >/dev/null || ! command -v g++ >/dev/null; then
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y -qq libigraph-dev pkg-config cmake g++ >/dev/null
fi
# --test: headless Chromium for the web page's browser tests (tests/test_web_page.py)
if [[ "$extras" == *test* ]] && ! command -v chromium >/dev/null; then
  { $sudo_cmd apt-get update -qq &&
    $sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null; } ||
    echo "setup: chromium could not be installed; the browser tests will skip (install it, or set COLGRAPH_CHROMIUM)" >&2
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip
"${pip[@]}" install -c requirements/constraints.txt torch torchvision numpy
"${pip[@]}" install -c requirements/constraints.txt scikit-build-core pybind11
"${pip[@]}" install -c requirements/constraints.txt --no-build-isolation -e ".${extras}"
.venv/bin/python -c "import colgraph_engine as cg; i = cg.backends(); print('colgraph_engine ready:', {k: i[k] for k in ('native', 'igraph_version', 'cpu_isa_float32', 'triton_importable') if k in i})"
