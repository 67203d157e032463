"""The dtypes a run computes in, chosen from the machine it meets.

bfloat16 halves the bytes of float32 and, where the hardware computes it, runs faster; where it
does not, each bfloat16 operation is emulated through float32 and runs several times slower. On
an AMD EPYC with AVX2 only, vLLM's CPU backend generated about 25 tokens/s in bfloat16 against
135 in float32 for the same SmolLM2 regeneration; on a CPU with AVX512-BF16 and AMX, bfloat16 was
the faster (issue 57's figures). Training is another matter: the draft's matmuls are small, and
on an AVX512-BF16 CPU without matrix units bfloat16 autocast trained no faster than float32
(benchmarks/bench_train_dtype.py: the casts eat what the faster matmuls save). So a config may say
`auto` for vLLM's and the trainer's dtype:

- on a GPU, vLLM's own `auto` (the model's dtype) serves, and training uses bfloat16;
- on a CPU that computes bfloat16 (the `avx512_bf16` or `amx_bf16` flags of /proc/cpuinfo), vLLM
  serves in bfloat16; training uses bfloat16 only with the matrix units (`amx_bf16`);
- everything else is float32.

An explicit dtype is always kept. `eaglenest plan` states the choice and its reason; the choice is
made where the workflow plans (with SLURM, the node that submits), and its value is part of the
servers' and the trainer's params, so a run moved to another kind of machine reruns what it
changes.
"""

from __future__ import annotations

from pathlib import Path

AUTO = "auto"
NATIVE_BFLOAT16_FLAGS = ("avx512_bf16", "amx_bf16")
MATRIX_BFLOAT16_FLAG = "amx_bf16"  # bfloat16 matrix units: what makes bfloat16 training pay on a CPU
CPUINFO = Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: Path = CPUINFO) -> set[str]:
    """The first CPU's flags as /proc/cpuinfo lists them (empty where there is none)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def has_gpu() -> bool:
    """Whether an NVIDIA GPU is visible, without importing torch (planning never does)."""
    return Path("/dev/nvidiactl").exists()


def choose_dtypes(vllm_dtype: str, train_dtype: str, device: str, flags: set[str] | None = None) -> dict:
    """The serving and training dtypes to use, and why: ``{"vllm", "train", "reason"}``."""
    gpu = device == "cuda" or (device == "auto" and has_gpu())
    flags = cpu_flags() if flags is None else flags
    native = sorted(f for f in NATIVE_BFLOAT16_FLAGS if f in flags)
    if gpu:
        machine, serve, train = "a GPU", AUTO, "bfloat16"
    elif native:
        machine, serve = f"a CPU that computes bfloat16 ({', '.join(native)})", "bfloat16"
        train = "bfloat16" if MATRIX_BFLOAT16_FLAG in native else "float32"
    else:
        machine, serve, train = (
            "a CPU without native bfloat16 (no avx512_bf16 or amx_bf16)",
            "float32",
            "float32",
        )
    chosen = {
        "vllm": serve if vllm_dtype == AUTO else vllm_dtype,
        "train": train if train_dtype == AUTO else train_dtype,
    }
    parts = []
    for key, asked in (("vllm", vllm_dtype), ("train", train_dtype)):
        what = "vllm.dtype" if key == "vllm" else "train.dtype"
        why = f" (auto on {machine})" if asked == AUTO else " (as configured)"
        if key == "train" and asked == AUTO and native and not gpu and train == "float32":
            why = f" (auto on {machine}: without amx_bf16 matrix units bfloat16 autocast trains no faster)"
        parts.append(f"{what} {chosen[key]}{why}")
    chosen["reason"] = "; ".join(parts)
    return chosen
