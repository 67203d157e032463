"""vLLM's CPU build, mended for DFlash drafts of more than one layer.

vLLM norms the context keys of all DFlash draft layers in one `rms_norm` call with one weight
row per layer (`DFlashQwen3Model._normalize_context_k`). The CPU kernel reads only the first
row, so every layer after the first attends to keys normed with the first layer's weight and
acceptance drops with no error (`tests/test_drafters.py` measures the kernel). Here the keys
are normed layer by layer, on CPU only. Remove it once the CPU kernel indexes the weight by
layer.

A vLLM general plugin of its own (pyproject.toml), like eaglenest.engine.vllm_cpu and under the
same switch, rather than part of it: no stage imports it, so only the stages that serve a draft
hash it (rules/evaluate.smk), and editing it does not rerun regeneration or extraction.
"""

from __future__ import annotations

import os

from eaglenest.engine.vllm_cpu import PATCH_ENV


def register() -> None:
    if os.environ.get(PATCH_ENV) != "1":
        return
    from vllm import _custom_ops as ops
    from vllm.model_executor.models.qwen3_dflash import DFlashQwen3Model
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return

    def normalize_context_k(self, all_k):
        out = all_k.new_empty(all_k.shape)
        for layer, weight in enumerate(self._k_norm_weights):
            ops.rms_norm(out[layer], all_k[layer].contiguous(), weight, self._rms_norm_eps)
        return out

    DFlashQwen3Model._normalize_context_k = normalize_context_k
