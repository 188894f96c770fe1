#!/usr/bin/env bash
# Training workloads (MLP, transformer, donation memory; Llama, GPT-2 and a bigger Llama) on a CUDA GPU, all
# peers in one run. For the GPU machine of the device tool, which has torch,
# JAX with CUDA and Python but not torchax, optax or xlakit's own source:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --platform manylinux2014_x86_64 -d .whl torchax==0.0.13 optax==0.2.8 transformers  # + their missing needs
# then run this script with .whl carried along. Results go to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # xlakit from this checkout
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 bench/training.py --device cuda
python3 bench/real_models.py --device cuda
