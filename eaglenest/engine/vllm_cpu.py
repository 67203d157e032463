"""vLLM's CPU build, loosened where it is stricter than its own kernels.

vLLM loads `register` in every one of its processes as a general plugin (the
`vllm.general_plugins` entry point in pyproject.toml); it changes nothing unless the process was
started by eaglenest (`PATCH_ENV`, set by `eaglenest.engine.server.engine_env`).

The patch: CPU attention declares its kernel block sizes as multiples of 32, yet its kernel runs
16-token blocks too (`_get_attn_isa` picks the "vec16" code for them). An MLA target on CPU
(Kimi-K2.5, DeepSeek-V3) only runs 16-token blocks (CPU_MLA), and the EAGLE-3 draft's Llama layer
uses CPU attention in the same KV cache group, so without the patch no block size satisfies both
and a server with the draft fails at start ("No common block size for 16"). On GPUs FlashMLA and
FlashAttention agree on 64 and this code is never reached. Remove it once vLLM's CPU backend
declares 16.
"""

from __future__ import annotations

import os

PATCH_ENV = "EAGLENEST_VLLM_CPU_PATCHES"


def register() -> None:
    if os.environ.get(PATCH_ENV) != "1":
        return
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    declared = CPUAttentionBackend.get_supported_kernel_block_sizes
    if getattr(declared, "eaglenest_patched", False):
        return

    def supported_kernel_block_sizes(kv_cache_spec=None):
        return [16, *declared(kv_cache_spec)]

    supported_kernel_block_sizes.eaglenest_patched = True
    CPUAttentionBackend.get_supported_kernel_block_sizes = staticmethod(supported_kernel_block_sizes)
