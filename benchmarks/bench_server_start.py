"""vLLM on CPU: three processes (its default) against one (VLLM_ENABLE_V1_MULTIPROCESSING=0).

On CPU, vLLM 0.32 runs the API server, the engine core and one worker as three processes, each
importing torch and vLLM anew. With VLLM_ENABLE_V1_MULTIPROCESSING=0 the engine core and its
worker run inside the API server's process. This measures, on a finished run's target and
server flags (and its trained draft with `--draft`), alternately for each layout: seconds from
launch to a healthy server, output tokens/s of the regenerate_responses rule's own client on the
run's prompts (temperature 0), and whether both layouts give the same answers. With --record
the run (the medians and each round) is added to the record `server_start` (benchmarks/records/,
with date, commit, machine, command, versions); `make docs` renders it.

Usage: python benchmarks/bench_server_start.py --workdir WORKDIR_OF_A_FINISHED_RUN
         [--configfile CONFIG] [--prompts 64] [--max-tokens 96] [--rounds 2] [--draft] [--record]
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
from records import append_run, command_line, head_commit, repo_path  # noqa: E402

LAYOUTS = {
    "three processes (vLLM default)": (),
    "one process (VLLM_ENABLE_V1_MULTIPROCESSING=0)": (("VLLM_ENABLE_V1_MULTIPROCESSING", "0"),),
}
# The layouts as the record's figures name them.
SHORT = dict(zip(LAYOUTS, ("three processes", "one process")))
ROUND_COLUMNS = ["round", "layout", "healthy after (s)", "output tokens", "seconds", "tok/s"]


def layout_figures(starts: dict, rates: dict, same: int, answers: int, draft: bool) -> dict:
    """The record's figures, named as its earlier runs name them: each layout's median seconds
    to a healthy server and output tokens/s, one process's tokens/s over three's, and whether
    the greedy answers are identical (how many, where not all)."""
    healthy = "healthy after with its draft" if draft else "healthy after"
    rate = "output tokens/s with its draft" if draft else "output tokens/s"
    figures = {f"{healthy}, {SHORT[n]} (s)": round(statistics.median(starts[n]), 1) for n in LAYOUTS}
    figures |= {f"{rate}, {SHORT[n]}": round(statistics.median(rates[n]), 1) for n in LAYOUTS}
    layout = {short: name for name, short in SHORT.items()}
    one, three = (statistics.median(rates[layout[s]]) for s in ("one process", "three processes"))
    figures["output tokens/s, one process against three (x)"] = round(one / three, 2)
    figures["greedy answers identical"] = same == answers or f"{same} of {answers}"
    return figures


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, required=True, help="working directory of a finished run")
    ap.add_argument("--configfile", type=Path, default=REPO / "config" / "config.yaml")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--draft", action="store_true", help="serve with the run's trained draft (k from config)")
    ap.add_argument("--record", action="store_true", help="add this run to the record `server_start`")
    return ap.parse_args()


def report(starts: dict, rates: dict, answers: dict, draft: bool) -> dict:
    """Prints each layout's medians and how many answers both layouts share; returns the
    record's figures."""
    for name in LAYOUTS:
        print(
            f"median {name:<48} start {statistics.median(starts[name]):6.1f} s, "
            f"{statistics.median(rates[name]):7.1f} tok/s"
        )
    first, second = answers.values()
    same = sum(a == b for a, b in zip(first, second))
    print(f"identical answers across layouts: {same} of {len(first)}")
    return layout_figures(starts, rates, same, len(first), draft)


def record_run(figures: dict, rounds: list, setting: str, commit: str) -> None:
    """The run's figures and rounds, added to the record `server_start`."""
    title = f"Each round, the layouts alternated ({setting})"
    tables = [{"title": title, "columns": ROUND_COLUMNS, "rows": rounds}]
    path = append_run("server_start", figures, command=command_line(), tables=tables, commit=commit)
    print(f"recorded in {repo_path(path)}; run `make docs`")


def main() -> None:
    args = parse_args()
    commit = head_commit() if args.record else None  # the commit measured, before the long run
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from eaglenest.data.regenerate import regenerate_responses
    from eaglenest.engine.server import ServerSpec, start, stop_pid
    from eaglenest.evaluation.methods import method_spec
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
    rounds = []  # ROUND_COLUMNS
    setting = f"{method}: {args.prompts} prompts, max_tokens {args.max_tokens}, concurrency {concurrency}"
    print(setting)
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
                tokens = sum(len(g["completion_token_ids"]) for r in rows for g in r["generations"])
                answers.setdefault(name, [r["generations"][-1]["completion_token_ids"] for r in rows])
                starts[name].append(started)
                rates[name].append(tokens / seconds)
                rounds.append([k + 1, SHORT[name], round(started, 1), tokens, round(seconds, 1),
                               round(tokens / seconds, 1)])  # fmt: skip
                print(
                    f"round {k + 1}: {name:<48} healthy after {started:6.1f} s; "
                    f"{tokens} output tokens in {seconds:6.1f} s: {tokens / seconds:7.1f} tok/s"
                )
    figures = report(starts, rates, answers, args.draft)
    if args.record:
        record_run(figures, rounds, f"{setting}; {repo_path(run_dir)}", commit)


if __name__ == "__main__":
    main()
