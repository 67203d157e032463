"""Regeneration against vLLM's own load generator: is eaglenest's client at the engine's ceiling?

One server (the regeneration server of a finished run: its target and flags), the same prompts,
sampling and concurrency, sent alternately by:
- eaglenest: `eaglenest.data.regenerate.regenerate_responses`, the regenerate_responses rule's own
  code, progress file and output included;
- vLLM: `vllm bench serve` (its Python entry point, `vllm.benchmarks.serve`), backend
  openai-chat on /v1/chat/completions, the prompts as a custom dataset.
Each prompt is its first user message, sent as a one-message chat by both; temperature 0, so
both get the same answers and the output tokens match. Prints output tokens/s of each round,
the medians and their ratio.

Usage: python benchmarks/bench_regeneration.py --workdir WORKDIR_OF_A_FINISHED_RUN
         [--configfile CONFIG] [--prompts 128] [--concurrency 32] [--max-tokens 160] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def first_user_prompts(path: Path, limit: int) -> list[dict]:
    prompts = []
    for line in Path(path).read_text().splitlines():
        row = json.loads(line)
        user = next((m["content"] for m in row["messages"] if m["role"] == "user"), None)
        if isinstance(user, str) and user:
            prompts.append({"id": row["id"], "messages": [{"role": "user", "content": user}]})
        if len(prompts) == limit:
            break
    return prompts


def client_cpu_seconds() -> float:
    """CPU seconds this process (the client) has used: on a shared CPU the client competes with
    the engine, so a heavier client lowers the server's throughput too."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_eaglenest(server, prompts_file: Path, target: str, sampling: dict, concurrency: int, scratch: Path):
    from eaglenest.data.regenerate import regenerate_responses

    out = scratch / "raw_responses.jsonl"
    t0 = time.perf_counter()
    counts = regenerate_responses(
        server, prompts_file, out, scratch, target=target, sampling=sampling, concurrency=concurrency
    )
    seconds = time.perf_counter() - t0
    assert counts["failed"] == 0, counts
    tokens = sum(
        len(g["completion_token_ids"])
        for line in out.read_text().splitlines()
        for g in json.loads(line)["generations"]
    )
    return tokens, seconds


def run_vllm_bench(server, dataset: Path, target: str, n: int, max_tokens: int, concurrency: int):
    from vllm.benchmarks import serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    serve.add_cli_args(parser)
    args = parser.parse_args(
        [
            "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
            "--base-url", server.base_url, "--model", "target", "--tokenizer", target,
            "--dataset-name", "custom", "--dataset-path", str(dataset), "--skip-chat-template",
            "--disable-shuffle", "--num-prompts", str(n), "--custom-output-len", str(max_tokens),
            "--max-concurrency", str(concurrency), "--request-rate", "inf",
            "--temperature", "0", "--disable-tqdm", "--ready-check-timeout-sec", "0",
        ]
    )  # fmt: skip
    os.environ["OPENAI_API_KEY"] = server.api_key  # vllm bench sends it as the bearer token
    result = serve.main(args)
    return result["total_output_tokens"], result["duration"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, required=True, help="working directory of a finished run")
    ap.add_argument("--configfile", type=Path, default=REPO / "config" / "config.yaml")
    ap.add_argument("--prompts", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=None, help="default: the config's")
    ap.add_argument("--max-tokens", type=int, default=None, help="default: the config's")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from eaglenest.engine.server import ServerSpec, start, stop_pid
    from eaglenest.pipeline.workflow import vllm_base_args, vllm_env
    from eaglenest.target.resolve import load_target

    cfg = yaml.safe_load(args.configfile.read_text())
    run_dir = args.workdir / cfg["run_dir"]
    target = load_target(run_dir / "target.json").path
    concurrency = args.concurrency or cfg["regenerate"]["concurrency"]
    max_tokens = args.max_tokens or cfg["regenerate"]["max_tokens"]
    sampling = {"max_tokens": max_tokens, "temperature": 0.0, "top_p": 1.0}
    with tempfile.TemporaryDirectory(prefix="bench-regen-", dir="/tmp") as tmp:
        tmp = Path(tmp)
        prompts = first_user_prompts(run_dir / "prompts" / "prompts.jsonl", args.prompts)
        prompts_file, dataset = tmp / "prompts.jsonl", tmp / "dataset.jsonl"
        prompts_file.write_text("".join(json.dumps(p) + "\n" for p in prompts))
        dataset.write_text(
            "".join(json.dumps({"prompt": p["messages"][0]["content"]}) + "\n" for p in prompts)
        )
        spec = ServerSpec(
            model=target, args=vllm_base_args(cfg["vllm"], cfg["target"]), env=vllm_env(cfg["vllm"])
        )
        server = start(spec, tmp, tmp / "server.log", timeout_s=cfg["vllm"]["startup_timeout_s"])
        rates: dict[str, list[float]] = {"eaglenest": [], "vllm bench serve": []}
        try:
            # Warm-up, not counted: the first requests pay one-off costs in the engine.
            run_eaglenest(
                server, prompts_file, target, {**sampling, "max_tokens": 8}, concurrency, tmp / "warm"
            )
            print(
                f"{len(prompts)} prompts, max_tokens {max_tokens}, temperature 0, concurrency {concurrency}"
            )
            senders = {
                "eaglenest": lambda k: run_eaglenest(
                    server, prompts_file, target, sampling, concurrency, tmp / f"r{k}"
                ),
                "vllm bench serve": lambda k: run_vllm_bench(
                    server, dataset, target, len(prompts), max_tokens, concurrency
                ),
            }
            for k in range(args.rounds):
                # Alternate the senders so a drift in the machine's speed hits both alike.
                for name, send in senders.items():
                    cpu0 = client_cpu_seconds()
                    tokens, secs = send(k)
                    cpu = client_cpu_seconds() - cpu0
                    rates[name].append(tokens / secs)
                    print(
                        f"round {k + 1}: {name:<16} {tokens:>7} output tokens in {secs:7.2f} s: "
                        f"{tokens / secs:8.1f} tok/s; client CPU {cpu:6.2f} s"
                    )
        finally:
            stop_pid(server.pid)
    ours, theirs = statistics.median(rates["eaglenest"]), statistics.median(rates["vllm bench serve"])
    print(
        f"median output tokens/s: eaglenest {ours:.1f}, vllm bench serve {theirs:.1f}; ratio {ours / theirs:.3f}"
    )


if __name__ == "__main__":
    main()
