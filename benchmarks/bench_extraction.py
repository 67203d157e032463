"""Hidden-state extraction against what the engine alone does, on the same rows.

On the tiny Llama target (untrained: throughput does not depend on the weights), random token
rows; each measurement sends every row once with the same concurrency:

1. eaglenest: `extract_shard_vllm`, the extract_hidden_states rule's own code (requests, then
   each file validated and moved into the shard, the manifest with every file's sha256);
2. the engine's extraction alone: the same requests to the same extraction server
   (speculators' `generate_hidden_states`), the engine's files left where it wrote them;
3. prefill only: the same token ids with one output token to a server with the same flags but
   no hidden-state extraction (nothing written): the engine's ceiling for this work.

Prints tokens/s of each (median of the rounds), the ratios 1/3 (goal >= 0.8) and 1/2 (what
eaglenest's own file handling costs), and the prefill-only rate at several concurrencies (does
more in flight keep the engine busier?). `--transformers` adds the transformers backend.

    .venv/bin/python benchmarks/bench_extraction.py [--rows 256] [--tokens 256] [--rounds 4]
        [--concurrency 16] [--dtype bfloat16] [--transformers]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASE_ARGS = ("--dtype", "float32", "--max-model-len", "1024", "--enforce-eager")
ENV = (("VLLM_CPU_KVCACHE_SPACE", "1"),)


def send_all(server, rows: list[list[int]], concurrency: int, extract: bool) -> float:
    """Seconds to send every row once (one output token), `concurrency` at a time."""
    import openai
    from speculators.data_generation.vllm_client import generate_hidden_states

    client = openai.OpenAI(base_url=server.api_url, api_key=server.client_key, max_retries=1, timeout=600)

    def one(ids):
        if extract:
            generate_hidden_states(client, "target", {"input_ids": ids}, timeout=600)
        else:
            client.completions.create(model="target", prompt=ids, max_tokens=1)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, rows))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=16, help="the config's hidden_states.concurrency")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--transformers", action="store_true", help="also time the transformers backend")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from eaglenest.draft.aux_layers import default_aux_layer_ids
    from eaglenest.engine.server import ServerSpec, start, stop_pid
    from eaglenest.hidden_states.extract import (
        extract_shard_transformers,
        extract_shard_vllm,
        vllm_extraction_spec,
    )
    from eaglenest.target.tiny import build_tiny_target

    with tempfile.TemporaryDirectory(prefix="bench-hs-", dir="/tmp") as tmp:
        tmp = Path(tmp)
        target = build_tiny_target(
            tmp / "target", [REPO / "data" / "tiny_target" / "corpus.jsonl"], pretrain_steps=0
        )
        cfg = json.loads((target / "config.json").read_text())
        n, hidden = cfg["num_hidden_layers"], cfg["hidden_size"]
        aux = default_aux_layer_ids(n)
        rng = random.Random(0)
        rows = [[rng.randrange(5, cfg["vocab_size"]) for _ in range(args.tokens)] for _ in range(args.rows)]
        tokenized = tmp / "tokenized_data.jsonl"
        tokenized.write_text(
            "".join(
                json.dumps({"id": str(i), "input_ids": ids, "loss_mask": [1] * len(ids)}) + "\n"
                for i, ids in enumerate(rows)
            )
        )
        total = args.rows * args.tokens
        rates: dict[str, list[float]] = {"eaglenest": [], "engine alone": [], "prefill only": []}
        sweep = {}

        plain = start(ServerSpec(model=str(target), args=BASE_ARGS, env=ENV), tmp, tmp / "plain.log")
        try:
            send_all(plain, rows[:8], args.concurrency, extract=False)  # warm-up
            for _ in range(args.rounds):
                rates["prefill only"].append(total / send_all(plain, rows, args.concurrency, extract=False))
            for c in sorted({1, args.concurrency, 2 * args.concurrency, 4 * args.concurrency, 16}):
                sweep[c] = total / send_all(plain, rows, c, extract=False)
        finally:
            stop_pid(plain.pid)

        spool = tmp / "spool"
        # As the stage serves it: the engine's own dtype, quantized by the stage for fp8 storage.
        spec = vllm_extraction_spec(str(target), aux, n, spool, BASE_ARGS, ENV, cpu=True)
        t0 = time.perf_counter()
        server = start(spec, tmp, tmp / "extraction.log")
        startup = time.perf_counter() - t0
        try:
            send_all(server, rows[:8], args.concurrency, extract=True)  # warm-up

            def eaglenest(k):
                out = tmp / "vllm" / f"shard_{k}"
                t0 = time.perf_counter()
                extract_shard_vllm(
                    server, tokenized, out, num_rows=args.rows, shard=0, num_shards=1, hidden_size=hidden,
                    dtype=args.dtype, meta={"aux_layer_ids": aux}, concurrency=args.concurrency,
                )  # fmt: skip
                rates["eaglenest"].append(total / (time.perf_counter() - t0))
                shutil.rmtree(out)

            def engine_alone(k):
                rates["engine alone"].append(total / send_all(server, rows, args.concurrency, extract=True))
                shutil.rmtree(spool, ignore_errors=True)  # the engine's files, left in place

            for k in range(args.rounds):
                # Alternate which goes first: a drift in the machine's speed hits both alike.
                for measure in (eaglenest, engine_alone) if k % 2 == 0 else (engine_alone, eaglenest):
                    measure(k)
        finally:
            stop_pid(server.pid)

        hf = None
        if args.transformers:
            t0 = time.perf_counter()
            extract_shard_transformers(
                str(target), tokenized, tmp / "hf" / "shard_0", num_rows=args.rows, shard=0, num_shards=1,
                aux_layer_ids=aux, dtype=args.dtype, meta={"aux_layer_ids": aux},
            )  # fmt: skip
            hf = total / (time.perf_counter() - t0)

    med = {k: statistics.median(v) for k, v in rates.items()}
    print(
        f"tiny target: {n} layers, hidden {hidden}; {args.rows} rows x {args.tokens} tokens = {total} "
        f"tokens; storage {args.dtype}; concurrency {args.concurrency}; {args.rounds} rounds; "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    print(f"extraction server start-up (once per run): {startup:.1f} s")
    for name, values in rates.items():
        print(
            f"{name:<14} median {med[name]:>8.0f} tokens/s  (rounds: {', '.join(f'{v:.0f}' for v in values)})"
        )
    print(f"eaglenest / prefill only: {med['eaglenest'] / med['prefill only']:.3f} (goal >= 0.8)")
    print(
        f"eaglenest / engine alone: {med['eaglenest'] / med['engine alone']:.3f} (eaglenest's file handling)"
    )
    print(
        "prefill only by concurrency: " + ", ".join(f"{c}: {r:.0f}" for c, r in sweep.items()) + " tokens/s"
    )
    if hf is not None:
        print(f"transformers backend: {hf:.0f} tokens/s")


if __name__ == "__main__":
    sys.exit(main())
