"""fp8 storage of hidden states: one scale per token and stored slot, and the error it costs.

hs_connectors' fp8 format (what speculators' trainer reads) keeps the values in float8_e4m3fn
beside float32 scales and dequantizes `values * scales`, broadcasting the scales. Its connector
writes one scale per token over all four stored slots, so a large activation in one slot (the
final layer's input often holds the largest) squeezes the other slots into fp8's subnormal
range or to zero: on synthetic states with one outlier in the last slot, slot 0 lost 62% of its
norm. Offline extraction quantizes here instead, with scales of shape [seq, slots, 1] (the
reader's broadcast takes them unchanged), and measures each slot's error on every token, so a
shard whose fp8 copy would mislead training is refused before it is stored.
"""

from __future__ import annotations

import threading

import torch
from hs_connectors.fp8_utils import dequantize_fp8_tensor

FP8_DTYPE = torch.float8_e4m3fn
# e4m3 keeps 3 mantissa bits: a value in its normal range is off by at most 2^-4 (6.25%) and by
# about 2-3% over a token (measured per slot on real shards, docs/results.md#fp8-error). A slot's mean
# above 5% means part of it fell below fp8's normal range (subnormals, zeros): its values no
# longer say what the target computed.
MAX_SLOT_ERROR = 0.05


def quantize(hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`hidden` [seq, slots, H] as fp8 values and float32 scales [seq, slots, 1]: each token's
    slot scaled by its own largest magnitude."""
    values = hidden.float()
    amax = values.abs().amax(dim=-1, keepdim=True)
    scales = (amax / torch.finfo(FP8_DTYPE).max).clamp(min=1e-12)
    return (values / scales).to(FP8_DTYPE), scales


def slot_errors(hidden: torch.Tensor, values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Relative L2 error of each token's slot after the round trip, [seq, slots]; a slot that is
    all zeros counts as exact."""
    exact = hidden.float()
    restored = dequantize_fp8_tensor(values, scales, dtype=torch.float32)
    norm = exact.norm(dim=-1)
    return (restored - exact).norm(dim=-1) / norm.clamp(min=torch.finfo(torch.float32).tiny)


class SlotErrorTally:
    """A shard's fp8 error per slot, over every token stored (samples arrive from several
    threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sum: torch.Tensor | None = None
        self._max: torch.Tensor | None = None
        self._tokens = 0

    def add(self, errors: torch.Tensor) -> None:
        self._add(errors.sum(dim=0).double(), errors.amax(dim=0).double(), errors.shape[0])

    def _add(self, total: torch.Tensor, worst: torch.Tensor, tokens: int) -> None:
        with self._lock:
            self._sum = total if self._sum is None else self._sum + total
            self._max = worst if self._max is None else torch.maximum(self._max, worst)
            self._tokens += tokens

    def state(self) -> dict | None:
        """What `add_state` adds to another tally, exactly (JSON: a sample's part, kept beside
        it in the sample store); None when nothing was quantized."""
        if not self._tokens:
            return None
        return {"sum": self._sum.tolist(), "max": self._max.tolist(), "tokens": self._tokens}

    def add_state(self, state: dict | None) -> None:
        if state is not None:
            total, worst = (torch.tensor(state[k], dtype=torch.float64) for k in ("sum", "max"))
            self._add(total, worst, state["tokens"])

    def summary(self) -> dict | None:
        """The manifest's record: mean and largest per-token error of each slot; None when no
        sample was quantized here."""
        if not self._tokens:
            return None
        return {
            "scales": "per token and slot",
            "tokens": self._tokens,
            "mean_per_slot": [round(v, 5) for v in (self._sum / self._tokens).tolist()],
            "max_per_slot": [round(v, 5) for v in self._max.tolist()],
            "max_mean_allowed": MAX_SLOT_ERROR,
        }

    def problem(self) -> str | None:
        """Why these states should not be stored in fp8, or None."""
        record = self.summary()
        if record is None:
            return None
        bad = [(i, m) for i, m in enumerate(record["mean_per_slot"]) if m > MAX_SLOT_ERROR]
        if not bad:
            return None
        worst = ", ".join(f"slot {i} {m:.1%}" for i, m in bad)
        return (
            f"fp8 would change these hidden states by {worst} per token on average (relative L2; "
            f"at most {MAX_SLOT_ERROR:.0%} allowed), even with a scale per token and slot: set "
            "hidden_states.dtype: bfloat16 (twice the bytes; hidden_states.mode online or hybrid "
            "store less)"
        )
