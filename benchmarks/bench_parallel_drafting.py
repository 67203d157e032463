"""Does vLLM draft a P-EAGLE head in parallel? One exported P-EAGLE draft, served two ways.

The finished run's draft (`draft.algorithm: p_eagle`) is served on the run's held-out prompts,
greedy, with the evaluation's own code (`eaglenest.evaluation.asking.evaluate_prompts`):
- parallel: as evaluation serves it (`"parallel_drafting": true`): one draft pass proposes k
  tokens, positions 2..k from mask-token slots, the way the head was trained;
- sequential: the same folder without the flag: vLLM drafts one token at a time, feeding the
  head its own proposals, a way it was never trained.
Prints tokens per target step, per-position acceptance, output tokens/s and whether the outputs
equal no speculation's, for each. Acceptance that differs between the two at positions 2..k is
the evidence that the flag changes how vLLM drafts.

Usage: python benchmarks/bench_parallel_drafting.py --workdir WORKDIR_OF_A_FINISHED_P_EAGLE_RUN
         [--configfile CONFIG] [--k 3]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, required=True, help="working directory of a finished run")
    ap.add_argument("--configfile", type=Path, default=REPO / "config" / "config.yaml")
    ap.add_argument("--k", type=int, default=None, help="draft tokens per step (default: the config's)")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from eaglenest.draft.algorithms import folder_algorithm, vllm_speculative_config
    from eaglenest.engine.server import ServerSpec, start, stop_pid
    from eaglenest.evaluation.asking import evaluate_prompts, held_out_conversations
    from eaglenest.pipeline.workflow import vllm_base_args, vllm_env
    from eaglenest.target.resolve import load_target

    cfg = yaml.safe_load(args.configfile.read_text())
    run_dir = args.workdir / cfg["run_dir"]
    draft = (run_dir / "draft").resolve()
    if folder_algorithm(draft) != "p_eagle":
        raise SystemExit(f"{draft}: not a P-EAGLE draft ({folder_algorithm(draft)})")
    target = load_target(run_dir / "target.json").path
    k = args.k or cfg["evaluate"]["num_speculative_tokens"]
    prompts = held_out_conversations(run_dir / "prompts" / "eval_prompts.jsonl")
    gen = {
        "max_tokens": cfg["evaluate"]["max_tokens"],
        "concurrency": cfg["evaluate"]["concurrency"],
        "stall_timeout_s": 600,
    }
    parallel = vllm_speculative_config("p_eagle", str(draft), k)
    sequential = {key: value for key, value in parallel.items() if key != "parallel_drafting"}
    ways = {"no speculation": None, "parallel": parallel, "sequential": sequential}
    base = list(vllm_base_args(cfg["vllm"], cfg["target"]))
    reference = None
    print(f"{len(prompts)} held-out prompts, k = {k}, max_tokens {gen['max_tokens']}, greedy; draft {draft}")
    with tempfile.TemporaryDirectory(prefix="bench-parallel-", dir="/tmp") as tmp:
        for name, spec in ways.items():
            extra = [] if spec is None else ["--speculative-config", json.dumps(spec)]
            server = start(
                ServerSpec(model=target, args=tuple(base + extra), env=vllm_env(cfg["vllm"])),
                Path(tmp),
                Path(tmp) / f"{name.replace(' ', '_')}.log",
                timeout_s=cfg["vllm"]["startup_timeout_s"],
            )
            try:
                result, outs = evaluate_prompts(server, prompts, k=k, spec_decoding=spec is not None, **gen)
            finally:
                stop_pid(server.pid)
            texts = {o["id"]: o["token_ids"] for o in outs}
            reference = reference or texts
            same = sum(texts[i] == reference[i] for i in reference) / len(reference)
            per_pos = result["per_position_acceptance"] or []
            print(
                f"{name:<15} tokens per target step {result['mean_acceptance_length']:.3f}; per position "
                f"{' / '.join(f'{p:.3f}' for p in per_pos) or '-'}; {result['output_tokens_per_s']:.1f} "
                f"output tok/s; outputs equal to no speculation's: {same:.0%}"
            )


if __name__ == "__main__":
    main()
