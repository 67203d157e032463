"""What fp8 storage would cost a run's hidden states, slot by slot, with either scale layout.

Reads the bfloat16 or float32 shards of a finished run (`hidden_states/shard_*/hs_*.safetensors`)
and quantizes every sample to float8_e4m3fn twice: with hs_connectors' scale per token (what its
fp8 connector writes, online) and with eaglenest's scale per token and slot (offline extraction,
eaglenest.hidden_states.fp8). Prints, per stored slot (the three auxiliary layers, then the final
layer's input), the relative L2 error per token: its mean, 99th percentile and largest, and the
share of the slot's nonzero values that fp8 flushed to zero. The limit offline extraction
applies (a slot's mean) is printed beside them.

Usage: python benchmarks/bench_fp8_error.py RUN_DIR_OR_SHARD_DIR [--max-samples 400]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from hs_connectors.fp8_utils import quantize_tensor_to_fp8
from safetensors.torch import load_file

from eaglenest.hidden_states import fp8


def sample_files(root: Path, limit: int) -> list[Path]:
    files = sorted(root.rglob("hs_*.safetensors"), key=lambda p: (p.parent.name, len(p.name), p.name))
    return files[:limit]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="a run folder, its hidden_states folder or one shard")
    parser.add_argument("--max-samples", type=int, default=400)
    args = parser.parse_args(argv)
    files = sample_files(args.root, args.max_samples)
    if not files:
        print(f"no hs_*.safetensors under {args.root}", file=sys.stderr)
        return 1
    layouts = {
        "per token (engine connector)": quantize_tensor_to_fp8,
        "per token and slot (offline)": fp8.quantize,
    }
    errors = {name: [] for name in layouts}
    flushed = {name: [] for name in layouts}
    for path in files:
        data = load_file(str(path))
        if "hidden_states_scales" in data:
            print(f"{path}: already fp8; this needs bfloat16 or float32 shards", file=sys.stderr)
            return 1
        states = data["hidden_states"].float()
        for name, quantize in layouts.items():
            values, scales = quantize(states)
            errors[name].append(fp8.slot_errors(states, values, scales))
            nonzero = states != 0
            zeroed = (values.float() == 0) & nonzero
            flushed[name].append(torch.stack([zeroed.sum(dim=(0, 2)), nonzero.sum(dim=(0, 2))]))
    tokens = sum(e.shape[0] for e in errors[next(iter(layouts))])
    hidden = load_file(str(files[0]))["hidden_states"]
    print(
        f"{args.root}: {len(files)} samples, {tokens} tokens, hidden size {hidden.shape[-1]}, "
        f"stored {hidden.dtype}; relative L2 error per token and slot (offline limit: a slot's "
        f"mean above {fp8.MAX_SLOT_ERROR:.0%} is refused)"
    )
    print(f"{'scales':<30} {'slot':>4} {'mean':>8} {'p99':>8} {'max':>8} {'zeroed':>8}")
    for name in layouts:
        per_token = torch.cat(errors[name])
        zeroed, nonzero = torch.stack(flushed[name]).sum(dim=0)
        for slot in range(per_token.shape[1]):
            e = per_token[:, slot]
            share = (zeroed[slot] / nonzero[slot].clamp(min=1)).item()
            print(
                f"{name:<30} {slot:>4} {e.mean().item():>8.2%} {e.quantile(0.99).item():>8.2%} "
                f"{e.max().item():>8.2%} {share:>8.2%}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
