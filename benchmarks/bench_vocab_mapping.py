"""Time the draft vocabulary mapping against speculators' own, on a realistic input.

A 163,840-id target (Qwen3-sized) and 20 M loss-masked tokens drawn from a Zipf law (s=1.1)
over a random id order, choosing 32,000 draft ids. eaglenest goes from token_freq.pt to all
four mapping files plus vocab_coverage.json; speculators' build_vocab_mappings_from_distribution
is timed on the same counts in its own dict form, alone and with its trainer's load/save.
Best and median of several runs each. Usage: python benchmarks/bench_vocab_mapping.py [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

from eaglenest.data.vocab import MappingPaths, build_vocab_mapping, compute_vocab_mapping

TARGET_VOCAB, DRAFT_VOCAB, TOKENS = 163_840, 32_000, 20_000_000


def zipf_counts(seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, TARGET_VOCAB + 1) ** 1.1
    counts = rng.multinomial(TOKENS, p / p.sum())[rng.permutation(TARGET_VOCAB)]
    return torch.from_numpy(counts.astype(np.int64))


def best_and_median(fn, repeat: int) -> tuple[float, float]:
    """Best shows the code's cost; the median shows how much a busy machine added."""
    fn()  # warm-up: first-call allocations, lazy imports
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times), float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()

    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution as spec_build

    counts = zipf_counts()
    ids = counts.nonzero().flatten()
    as_dict = dict(zip(ids.tolist(), counts[ids].tolist()))  # what speculators' counter saves

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        dense_pt, dict_pt = tmp / "token_freq.pt", tmp / "token_freq_dict.pt"
        torch.save(counts, dense_pt)
        torch.save(as_dict, dict_pt)
        out = MappingPaths.in_dir(tmp / "out")
        with_plot = MappingPaths.in_dir(tmp / "out_plot", coverage_plot=tmp / "cov.png")

        def speculators_file_path():
            d2t, t2d = spec_build(torch.load(dict_pt, weights_only=True), DRAFT_VOCAB, TARGET_VOCAB)
            np.save(tmp / "spec_d2t.npy", d2t.numpy())
            np.save(tmp / "spec_t2d.npy", t2d.numpy())

        rows = [
            (
                "eaglenest  dense token_freq.pt -> 4 files + coverage json",
                lambda: build_vocab_mapping(dense_pt, DRAFT_VOCAB, out),
            ),
            (
                "eaglenest  dict token_freq.pt  -> 4 files + coverage json",
                lambda: build_vocab_mapping(dict_pt, DRAFT_VOCAB, out, target_vocab_size=TARGET_VOCAB),
            ),
            (
                "eaglenest  in memory: selection + coverage curve",
                lambda: compute_vocab_mapping(counts, DRAFT_VOCAB),
            ),
            (
                "eaglenest  dense file -> 4 files + json + coverage PNG",
                lambda: build_vocab_mapping(dense_pt, DRAFT_VOCAB, with_plot),
            ),
            (
                "speculators build_vocab_mappings_from_distribution (dict)",
                lambda: spec_build(as_dict, DRAFT_VOCAB, TARGET_VOCAB),
            ),
            ("speculators dict file -> load, build, np.save d2t/t2d", speculators_file_path),
        ]
        timings = [(name, *best_and_median(fn, args.repeat)) for name, fn in rows]

        # Same answer, or the timing means nothing.
        ref_d2t, ref_t2d = spec_build(as_dict, DRAFT_VOCAB, TARGET_VOCAB)
        build_vocab_mapping(dense_pt, DRAFT_VOCAB, out)
        same = torch.equal(torch.load(out.t2d_pt, weights_only=True), ref_t2d) and torch.equal(
            torch.load(out.d2t_pt, weights_only=True), ref_d2t
        )

    print(
        f"target vocab {TARGET_VOCAB:,}, draft vocab {DRAFT_VOCAB:,}, {TOKENS:,} masked tokens, "
        f"{len(as_dict):,} distinct ids seen; {args.repeat} runs each, torch threads "
        f"{torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}"
    )
    width = max(len(row[0]) for row in timings)
    print(f"{'path':<{width}}  {'best ms':>8}  {'median ms':>9}")
    for name, best, median in timings:
        print(f"{name:<{width}}  {best * 1e3:>8.1f}  {median * 1e3:>9.1f}")
    ratio = timings[4][1] / timings[0][1]
    print(f"eaglenest file->files vs speculators' function alone (best): {ratio:.1f}x faster")
    print(f"identical t2d/d2t to speculators: {same}")


if __name__ == "__main__":
    main()
