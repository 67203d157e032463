"""vLLM on CPU: three processes (its default) against one (VLLM_ENABLE_V1_MULTIPROCESSING=0).

On CPU, vLLM 0.32 runs the API server, the engine core and one worker as three processes, each
importing torch and vLLM anew. With VLLM_ENABLE_V1_MULTIPROCESSING=0 the engine core and its
worker run inside the API server's process. This measures, on a finished run's target and
server flags (and its trained draft with `--draft`), alternately for each layout: seconds from
launch to a healthy server, output tokens/s of the regenerate_responses rule's own client on the
run's prompts (temperature 0), and whether both layouts give the same answers.

Usage: python benchmarks/bench_server_start.py --workdir WORKDIR_OF_A_FINISHED_RUN
         [--configfile CONFIG] [--prompts 64] [--max-tokens 96] [--rounds 2] [--draft]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_regeneration import first_user_prompts  # noqa: E402

LAYOUTS = {
    "three processes (vLLM default)": (),
    "one process (VLLM_ENABLE_V1_MULTIPROCESSING=0)": (("VLLM_ENABLE_V1_MULTIPROCESSING", "0"),),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, required=True, help="working directory of a finished run")
    ap.add_argument("--configfile", type=Path, default=REPO / "config" / "config.yaml")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--draft", action="store_true", help="serve with the run's trained draft (k from config)")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from eaglenest.data.regenerate import regenerate_responses
    from eaglenest.engine.server import ServerSpec, start, stop_pid
    from eaglenest.evaluation.evaluate import method_spec
    from eaglenest.pipeline.workflow import vllm_base_args, vllm_env
    from eaglenest.target.resolve import load_target

    cfg = yaml.safe_load(args.configfile.read_text())
    run_dir = args.workdir / cfg["run_dir"]
    target = load_target(run_dir / "target.json").path
    method = "draft" if args.draft else "no_spec"
    base = method_spec(
        method,
        target,
        vllm_base_args(cfg["vllm"], cfg["target"]),
        vllm_env(cfg["vllm"]),
        k=cfg["evaluate"]["num_speculative_tokens"],
        draft_dir=run_dir / "draft",
        ngram=cfg["evaluate"].get("ngram"),
    )
    sampling = {"max_tokens": args.max_tokens, "temperature": 0.0, "top_p": 1.0}
    concurrency = cfg["evaluate"]["concurrency"] if args.draft else cfg["regenerate"]["concurrency"]
    starts: dict[str, list[float]] = {name: [] for name in LAYOUTS}
    rates: dict[str, list[float]] = {name: [] for name in LAYOUTS}
    answers: dict[str, list[list[int]]] = {}
    print(f"{method}: {args.prompts} prompts, max_tokens {args.max_tokens}, concurrency {concurrency}")
    with tempfile.TemporaryDirectory(prefix="bench-server-start-", dir="/tmp") as tmp:
        tmp = Path(tmp)
        prompts_file = tmp / "prompts.jsonl"
        prompts = first_user_prompts(run_dir / "prompts" / "prompts.jsonl", args.prompts)
        prompts_file.write_text("".join(json.dumps(p) + "\n" for p in prompts))
        for k in range(args.rounds):
            for name, extra_env in LAYOUTS.items():  # alternated: a drift hits both alike
                spec = ServerSpec(model=base.model, args=base.args, env=(*base.env, *extra_env))
                t0 = time.perf_counter()
                server = start(spec, tmp, tmp / f"server-{k}.log", timeout_s=cfg["vllm"]["startup_timeout_s"])
                started = time.perf_counter() - t0
                try:
                    out = tmp / f"out-{k}-{len(starts[name])}.jsonl"
                    t1 = time.perf_counter()
                    counts = regenerate_responses(
                        server, prompts_file, out, tmp / f"p-{k}-{name[:3]}", target=target,
                        sampling=sampling, concurrency=concurrency,
                    )  # fmt: skip
                    seconds = time.perf_counter() - t1
                finally:
                    stop_pid(server.pid)
                assert counts["failed"] == 0, counts
                rows = [json.loads(line) for line in out.read_text().splitlines()]
                tokens = sum(len(r["completion_token_ids"]) for r in rows)
                answers.setdefault(name, [r["completion_token_ids"] for r in rows])
                starts[name].append(started)
                rates[name].append(tokens / seconds)
                print(
                    f"round {k + 1}: {name:<48} healthy after {started:6.1f} s; "
                    f"{tokens} output tokens in {seconds:6.1f} s: {tokens / seconds:7.1f} tok/s"
                )
    for name in LAYOUTS:
        print(
            f"median {name:<48} start {statistics.median(starts[name]):6.1f} s, "
            f"{statistics.median(rates[name]):7.1f} tok/s"
        )
    first, second = answers.values()
    same = sum(a == b for a, b in zip(first, second))
    print(f"identical answers across layouts: {same} of {len(first)}")


if __name__ == "__main__":
    main()
