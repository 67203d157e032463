"""Hidden-state extraction on the tiny target: vLLM against the transformers fallback, one run.

Prints tokens/s and bytes/token for each backend on the same rows, and the vLLM server's start-up
time separately (a run pays it once; the lease then reuses the server for every shard).

    .venv/bin/python benchmarks/bench_extraction.py [--rows 64] [--tokens 256]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from eaglenest.draft_config import default_aux_layer_ids
    from eaglenest.hidden_states import (
        extract_shard_transformers,
        extract_shard_vllm,
        vllm_extraction_spec,
    )
    from eaglenest.server import Lease
    from eaglenest.tiny_target import build_tiny_target

    with tempfile.TemporaryDirectory(prefix="bench-hs-", dir="/tmp") as tmp:
        tmp = Path(tmp)
        target = build_tiny_target(tmp / "target", [REPO / "data" / "prompts" / "default.jsonl"])
        cfg = json.loads((target / "config.json").read_text())
        n, hidden = cfg["num_hidden_layers"], cfg["hidden_size"]
        aux = default_aux_layer_ids(n)
        rng = random.Random(0)
        rows = tmp / "tokenized_data.jsonl"
        with open(rows, "w") as f:
            for i in range(args.rows):
                ids = [rng.randrange(5, cfg["vocab_size"]) for _ in range(args.tokens)]
                f.write(json.dumps({"id": str(i), "input_ids": ids, "loss_mask": [1] * len(ids)}) + "\n")
        total = args.rows * args.tokens
        meta = {"aux_layer_ids": aux}
        results = []

        spec = vllm_extraction_spec(
            str(target),
            aux,
            n,
            tmp / "spool",
            ("--dtype", "float32", "--max-model-len", "1024", "--enforce-eager"),
            (("VLLM_CPU_KVCACHE_SPACE", "1"),),
            cpu=True,
        )
        lease = Lease(tmp)
        t0 = time.perf_counter()
        server = lease.acquire(spec)
        startup = time.perf_counter() - t0
        try:
            t0 = time.perf_counter()
            extract_shard_vllm(
                server,
                rows,
                tmp / "vllm" / "shard_0",
                num_rows=args.rows,
                shard=0,
                num_shards=1,
                hidden_size=hidden,
                dtype=args.dtype,
                meta=meta,
            )
            results.append(("vllm", time.perf_counter() - t0, tmp / "vllm" / "shard_0"))
        finally:
            lease.release()

        t0 = time.perf_counter()
        extract_shard_transformers(
            str(target),
            rows,
            tmp / "hf" / "shard_0",
            num_rows=args.rows,
            shard=0,
            num_shards=1,
            aux_layer_ids=aux,
            dtype=args.dtype,
            meta=meta,
        )
        results.append(("transformers", time.perf_counter() - t0, tmp / "hf" / "shard_0"))

        print(
            f"tiny target: {n} layers, hidden {hidden}; {args.rows} rows x {args.tokens} "
            f"tokens = {total} tokens; storage {args.dtype}; {os.cpu_count()} CPUs, "
            f"load average {os.getloadavg()[0]:.1f}"
        )
        print(f"vLLM server start-up (once per run): {startup:.1f} s")
        print(f"{'backend':<14}{'seconds':>9}{'tokens/s':>11}{'bytes/token':>13}{'expected':>10}")
        expected = 4 * hidden * (2 if args.dtype != "float32" else 4)
        for name, secs, shard in results:
            size = sum(p.stat().st_size for p in shard.glob("hs_*.safetensors"))
            print(f"{name:<14}{secs:>9.2f}{total / secs:>11.0f}{size / total:>13.1f}{expected:>10}")


if __name__ == "__main__":
    sys.exit(main())
