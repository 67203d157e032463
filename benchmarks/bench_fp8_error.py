"""What fp8 storage would cost a run's hidden states, slot by slot, with either scale layout.

Reads the bfloat16 or float32 shards of a finished run (`hidden_states/shard_*/hs_*.safetensors`)
and quantizes every sample to float8_e4m3fn twice: with hs_connectors' scale per token (what its
fp8 connector writes, online) and with eaglenest's scale per token and slot (offline extraction,
eaglenest.hidden_states.fp8). Prints, per stored slot (the three auxiliary layers, then the final
layer's input), the relative L2 error per token: its mean, 99th percentile and largest, and the
share of the slot's nonzero values that fp8 flushed to zero. The limit offline extraction
applies (a slot's mean) is printed beside them. With --record the run (its figures and tables,
the states named by --label) is added to the record `fp8_error` (benchmarks/records/, with date,
commit, machine, command, versions); `make docs` renders it.

Usage: python benchmarks/bench_fp8_error.py RUN_DIR_OR_SHARD_DIR [--max-samples 400]
           [--record [--label "the suite's default run"]]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from hs_connectors.fp8_utils import quantize_tensor_to_fp8
from records import append_run, command_line, repo_path
from safetensors.torch import load_file

from eaglenest.hidden_states import fp8

LAYOUTS = {
    "per token (engine connector)": quantize_tensor_to_fp8,
    "per token and slot (offline)": fp8.quantize,
}
# The layouts as the record names them (its first run's table), so that runs line up.
RECORD_LAYOUTS = {
    "per token (engine connector)": "one scale per token",
    "per token and slot (offline)": "a scale per token and slot",
}
STATS = ("mean", "p99", "max", "zeroed")


def sample_files(root: Path, limit: int) -> list[Path]:
    files = sorted(root.rglob("hs_*.safetensors"), key=lambda p: (p.parent.name, len(p.name), p.name))
    return files[:limit]


def measure(files: list[Path]) -> tuple[dict, dict] | None:
    """Per layout, each sample's relative L2 error per token and slot, and its values flushed
    to zero and nonzero per slot; None where a shard is already fp8."""
    errors = {name: [] for name in LAYOUTS}
    flushed = {name: [] for name in LAYOUTS}
    for path in files:
        data = load_file(str(path))
        if "hidden_states_scales" in data:
            print(f"{path}: already fp8; this needs bfloat16 or float32 shards", file=sys.stderr)
            return None
        states = data["hidden_states"].float()
        for name, quantize in LAYOUTS.items():
            values, scales = quantize(states)
            errors[name].append(fp8.slot_errors(states, values, scales))
            nonzero = states != 0
            zeroed = (values.float() == 0) & nonzero
            flushed[name].append(torch.stack([zeroed.sum(dim=(0, 2)), nonzero.sum(dim=(0, 2))]))
    return errors, flushed


def slot_stats(errors: dict, flushed: dict) -> dict:
    """Per layout, per slot: the error's mean, 99th percentile and largest, and the share of
    nonzero values flushed to zero (fractions)."""
    stats = {}
    for name in LAYOUTS:
        per_token = torch.cat(errors[name])
        zeroed, nonzero = torch.stack(flushed[name]).sum(dim=0)
        stats[name] = [
            {
                "mean": per_token[:, slot].mean().item(),
                "p99": per_token[:, slot].quantile(0.99).item(),
                "max": per_token[:, slot].max().item(),
                "zeroed": (zeroed[slot] / nonzero[slot].clamp(min=1)).item(),
            }
            for slot in range(per_token.shape[1])
        ]
    return stats


def record_run(label: str, states: dict, stats: dict) -> Path:
    """The run in the record: samples, tokens, each slot's mean and largest error per layout;
    the record's mean/largest table (one row: these states) and every statistic per slot."""
    figures = {
        "samples": states["samples"],
        "tokens": states["tokens"],
        "hidden size": states["hidden"],
        "stored dtype": states["dtype"],
    }
    for name, slots in stats.items():
        for slot, s in enumerate(slots):
            figures[f"{RECORD_LAYOUTS[name]}: slot {slot} mean error (%)"] = round(s["mean"] * 100, 2)
            figures[f"{RECORD_LAYOUTS[name]}: slot {slot} largest error (%)"] = round(s["max"] * 100, 2)
    summary = [
        ", ".join(f"{s['mean'] * 100:.2f}/{s['max'] * 100:.2f}" for s in slots) + "%"
        for slots in stats.values()
    ]
    row = f"{label} ({states['samples']:,} samples, {states['tokens']:,} tokens, {states['dtype']})"
    per_slot = [
        [name, slot, *(round(s[k] * 100, 2) for k in STATS)]
        for name, slots in stats.items()
        for slot, s in enumerate(slots)
    ]
    tables = [
        {
            "title": f"Relative L2 error per token, mean/largest, slot 0 to {len(per_slot) // len(stats) - 1}",
            "columns": ["states", *RECORD_LAYOUTS.values()],
            "rows": [[row, *summary]],
        },
        {
            "title": "Per slot: relative L2 error per token and the nonzero values flushed to zero (%)",
            "columns": ["scales", "slot", *STATS],
            "rows": per_slot,
        },
    ]
    return append_run("fp8_error", figures, command=command_line(), tables=tables)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="a run folder, its hidden_states folder or one shard")
    parser.add_argument("--max-samples", type=int, default=400)
    parser.add_argument("--record", action="store_true", help="add this run to the record `fp8_error`")
    parser.add_argument("--label", help="what the states are, for the record (default: ROOT)")
    args = parser.parse_args(argv)
    files = sample_files(args.root, args.max_samples)
    if not files:
        print(f"no hs_*.safetensors under {args.root}", file=sys.stderr)
        return 1
    measured = measure(files)
    if measured is None:
        return 1
    errors, flushed = measured
    tokens = sum(e.shape[0] for e in errors[next(iter(LAYOUTS))])
    hidden = load_file(str(files[0]))["hidden_states"]
    print(
        f"{args.root}: {len(files)} samples, {tokens} tokens, hidden size {hidden.shape[-1]}, "
        f"stored {hidden.dtype}; relative L2 error per token and slot (offline limit: a slot's "
        f"mean above {fp8.MAX_SLOT_ERROR:.0%} is refused)"
    )
    print(f"{'scales':<30} {'slot':>4} {'mean':>8} {'p99':>8} {'max':>8} {'zeroed':>8}")
    stats = slot_stats(errors, flushed)
    for name, slots in stats.items():
        for slot, s in enumerate(slots):
            print(f"{name:<30} {slot:>4} " + " ".join(f"{s[k]:>8.2%}" for k in STATS))
    if args.record:
        states = {
            "samples": len(files),
            "tokens": tokens,
            "hidden": hidden.shape[-1],
            "dtype": str(hidden.dtype).removeprefix("torch."),
        }
        path = record_run(args.label or str(args.root), states, stats)
        print(f"recorded in {repo_path(path)}; run `make docs`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
