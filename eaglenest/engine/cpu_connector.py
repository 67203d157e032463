"""vLLM's hidden-states connector, made to run on a CPU-only machine.

`ExampleHiddenStatesConnector` copies hidden states off the GPU asynchronously into pinned
memory on a CUDA stream; on CPU that fails (`pin_memory=True requires a CUDA ... backend`).
This subclass replaces only that step with a synchronous copy and write; everything else (file
naming, lock files, the `hidden_states_path` handed back to the client) is vLLM's own. vLLM
loads it through `kv_connector_module_path`; on GPU machines the original connector is used.
`CpuFP8HiddenStatesConnector` does the same for fp8 storage.
"""

from __future__ import annotations

import fcntl
import os

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    extract_from_kv_cache,
)


class _Done:
    """Stands in for the CUDA event the base class polls: the copy is already complete."""

    def query(self) -> bool:
        return True


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
    def _submit_async_write(self, pending) -> None:
        if not self._is_tp_rank_zero:
            return
        block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(self._block_size, dtype=torch.long)
        slots = (offsets[None, :] + block_ids[:, None] * self._block_size).flatten()
        hidden = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0]).clone()
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        try:
            save_file(self._tensors(hidden, pending.token_ids.clone()), pending.filename)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)
        self._req_copy_events[pending.req_id] = _Done()

    @staticmethod
    def _tensors(hidden: torch.Tensor, token_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"hidden_states": hidden, "token_ids": token_ids}


class CpuFP8HiddenStatesConnector(CpuHiddenStatesConnector):
    """The CPU twin of hs_connectors' `FP8HiddenStatesConnector`: the same file (fp8 values,
    one float32 scale per token), which the trainer's fp8 transfer dequantizes."""

    @staticmethod
    def _tensors(hidden: torch.Tensor, token_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        from hs_connectors.fp8_utils import SCALES_KEY, quantize_tensor_to_fp8

        values, scales = quantize_tensor_to_fp8(hidden)
        return {"hidden_states": values, SCALES_KEY: scales, "token_ids": token_ids}
