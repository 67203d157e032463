"""Measure acceptance in vLLM: the number a user cares about (the `evaluate_acceptance` stage).

On the held-out prompts and the configured benchmarks, in every configured mode, greedy, vLLM
serves the target each way of eaglenest.evaluation.methods: no speculation, the model-free
baselines, an untrained draft (the floor) and the trained draft, with the same
`num_speculative_tokens`. Acceptance comes from each response's own spec-decode metrics, so it
breaks down by set, mode, category, traffic class, turn, request and span. Speculation must be
lossless: each method's greedy outputs are compared with those of no speculation. A sweep's
variant serves its trained draft alone and is compared with the run's own no-speculation outputs.

The parts, each in its module: the methods and their servers (`methods`), the untrained floor
(`untrained_draft`), what is asked and how (`asking`), the figures (`figures`, `spans`), the
tables (`tables`) and the plots (`plots`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from eaglenest.core.errors import EaglenestError
from eaglenest.core.io import iter_jsonl, read_json, read_jsonl, write_json, write_jsonl
from eaglenest.data.benchmarks import ACCEPTANCE_DEFINITIONS, HELD_OUT
from eaglenest.data.modes import checked_modes
from eaglenest.evaluation.asking import (
    ask_conversations,
    check_spec_metrics,
    held_out_conversations,
    in_mode,
    reference_answers,
)
from eaglenest.evaluation.figures import (
    judge_against_noise_floor,
    lossless_meaning,
    ngram_identical_fraction,
    set_figures,
)
from eaglenest.evaluation.methods import DRAFTS, METHODS, method_server
from eaglenest.evaluation.plots import plot_per_position, plot_requests, plot_sets
from eaglenest.evaluation.spans import SpanLabeller
from eaglenest.evaluation.tables import request_rows, write_requests, write_set_table, write_table
from eaglenest.evaluation.untrained_draft import make_untrained_draft
from eaglenest.pipeline.workflow import with_parsers
from eaglenest.target.resolve import load_tokenizer

log = logging.getLogger(__name__)

STORED_FIELDS = ("method", "set", "mode", "id", "turn", "token_ids", "text")
# Kept where present: a replayed tool loop's next round is asked after the reference's.
STORED_IF_PRESENT = ("tool_calls", "reasoning")


def evaluated_conversations(held_out_path, benchmarks_path, modes, max_tool_rounds: int = 0) -> list[dict]:
    """Every conversation the methods are asked: the held-out prompts (those with recorded tool
    results as tool loops of up to `max_tool_rounds` rounds), then each benchmark's, in each
    configured mode."""
    conversations = held_out_conversations(held_out_path, max_tool_rounds)
    if benchmarks_path:
        conversations += read_jsonl(benchmarks_path)
    return [c for mode in checked_modes(modes) for c in in_mode(conversations, mode)]


def _groups(conversations: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """The conversations by (set, mode): each group is asked on its own, so its seconds are its."""
    groups: dict = {}
    for c in conversations:
        groups.setdefault((c["benchmark"], c["mode"]), []).append(c)
    return groups


def _drafts(methods, draft_dir, run_dir, target) -> dict:
    """The draft folder each draft method serves: the trained draft, and an untrained one if asked."""
    drafts = {"draft": draft_dir}
    if "untrained_draft" in methods:
        drafts["untrained_draft"] = make_untrained_draft(
            draft_dir, Path(run_dir) / ".eaglenest" / "eval" / "untrained_draft", target.path
        )
    return drafts


def _ask_method(server, method: str, conversations, answers: dict, gen: dict) -> list[dict]:
    """One method's outputs for every (set, mode) group, with each group's seconds and cuts."""
    asked = []
    for (name, mode), group in _groups(conversations).items():
        outs, seconds, too_long = ask_conversations(
            server, group, answers, is_reference=method == "no_spec", **gen
        )
        if method != "no_spec":
            check_spec_metrics(server, outs)
        asked.append({"set": name, "mode": mode, "outs": outs, "seconds": seconds, "too_long": too_long})
    return asked


def _figures_per_set(asked: list[dict], answers: dict, k: int) -> dict:
    """Each set's figures, its modes together and each apart."""
    per_set = {}
    for name in dict.fromkeys(a["set"] for a in asked):
        parts = [a for a in asked if a["set"] == name]
        per_set[name] = set_figures(
            [o for a in parts for o in a["outs"]],
            {a["mode"]: a["seconds"] for a in parts},
            sorted({c for a in parts for c in a["too_long"]}),
            answers,
            k,
        )
    return per_set


def _evaluate_methods(
    methods, target, server_cfg, run_dir, k, ngram, drafts, conversations, answers, gen, labeller
):
    """Each method on its own server: the per-set figures and every stored output."""
    per_set: dict = {}
    stored: list[dict] = []
    for method in methods:
        with method_server(
            method, target, server_cfg, run_dir, k=k, ngram=ngram, draft_dir=drafts.get(method)
        ) as server:
            asked = _ask_method(server, method, conversations, answers, gen)
        for a in asked:
            labeller.annotate(a["outs"], drafts_every_step=method in DRAFTS)
            stored += [{"method": method, **o} for o in a["outs"]]
        per_set[method] = _figures_per_set(asked, answers, k)
        held_out = per_set[method][HELD_OUT]
        log.info(
            "%s: held out %.3f tokens per target step, rate %s, %.1f tok/s, lossless %s",
            method,
            held_out["mean_acceptance_length"],
            held_out["acceptance_rate"],
            held_out["output_tokens_per_s"] or 0,
            held_out["lossless"],
        )
    return per_set, stored


def tensor_parallel_size(base_args) -> int:
    args = list(base_args)
    return int(args[args.index("--tensor-parallel-size") + 1]) if "--tensor-parallel-size" in args[:-1] else 1


def _judge_lossless(per_set, stored, answers, methods, server_cfg, reference_outputs) -> str:
    """Judge the drafts against n-gram's noise floor where there is one; what `lossless` means here."""
    # Where the engine is not bit-reproducible (tensor parallel ranks; 16-bit kernels whose
    # verification batches differ from decoding), n-gram's outputs already differ: then a
    # draft is judged against that floor. Where n-gram is exact, any difference is a bug.
    tp = tensor_parallel_size(server_cfg["base_args"])
    # A sweep's variant takes n-gram's outputs from the run's evaluation; a run without n-gram has none.
    own = "ngram" in methods or reference_outputs is None
    rows = stored if own else list(iter_jsonl(reference_outputs))
    floor = ngram_identical_fraction(rows, answers)
    noisy = floor is not None and (tp > 1 or floor < 1)
    if noisy:
        for name in per_set[methods[-1]]:
            set_floor = ngram_identical_fraction(rows, answers, name)
            if set_floor is not None:
                figures = {m: per_set[m][name] for m in methods}
                judge_against_noise_floor(figures, set_floor, per_set[methods[-1]][name]["requests"])
    return lossless_meaning(tp, floor if noisy else None)


def evaluate_stage(
    *,
    run_dir,
    target,
    draft_dir,
    prompts_path,
    metadata_path,
    server_cfg: dict,
    k: int,
    max_tokens: int,
    concurrency: int,
    ngram: dict,
    out_json,
    out_csv,
    out_png,
    out_outputs,
    benchmarks_path=None,
    out_sets=None,
    out_sets_png=None,
    out_requests=None,
    out_request_png=None,
    methods=METHODS,
    reference_outputs=None,
    modes=None,
    reasoning_parser: str | None = None,
    tool_call_parser: str | None = None,
    max_tool_rounds: int = 0,
) -> dict:
    """The `evaluate_acceptance` rule: each of `methods` on one server each, asked every
    conversation of the held-out prompts and of `benchmarks_path` (eaglenest.data.benchmarks) in
    every mode. Every greedy output goes to `out_outputs` (JSONL: method, set, mode, id, turn,
    token_ids, text). Without no_spec among `methods` (a sweep's variant), losslessness and the
    earlier turns' answers come from the no_spec outputs in `reference_outputs`, an earlier
    evaluation's `out_outputs`. `target` is the resolved target (eaglenest.target.resolve.Target).
    The servers parse reasoning and tool calls as regeneration's do; with a tool-call parser, the
    held-out prompts with recorded tool results are replayed as loops of up to
    `max_tool_rounds` rounds."""
    tokenizer = _checked_tokenizer(target, metadata_path)
    server_cfg = {
        **server_cfg,
        "base_args": list(with_parsers(tuple(server_cfg["base_args"]), reasoning_parser, tool_call_parser)),
    }
    conversations = evaluated_conversations(
        prompts_path, benchmarks_path, modes, max_tool_rounds if tool_call_parser else 0
    )
    # no_spec's outputs by (set, mode, id, turn): the reference every method must equal, and the
    # answers a conversation's later turns are asked after.
    answers = {} if "no_spec" in methods else reference_answers(reference_outputs, conversations)
    drafts = _drafts(methods, draft_dir, run_dir, target)
    gen = dict(max_tokens=max_tokens, concurrency=concurrency, stall_timeout_s=server_cfg["stall_timeout_s"])
    per_set, stored = _evaluate_methods(
        methods,
        target,
        server_cfg,
        run_dir,
        k,
        ngram,
        drafts,
        conversations,
        answers,
        gen,
        SpanLabeller(tokenizer),
    )
    lossless_means = _judge_lossless(per_set, stored, answers, methods, server_cfg, reference_outputs)
    results = {m: per_set[m][HELD_OUT] for m in methods}
    summary = {
        "num_speculative_tokens": k,
        "prompts": sum(c["benchmark"] == HELD_OUT for c in conversations),
        "modes": [m["name"] for m in checked_modes(modes)],
        "max_tokens": max_tokens,
        "lossless_means": lossless_means,
        "definitions": ACCEPTANCE_DEFINITIONS,
        **results,
        "benchmarks": {
            name: {
                "conversations": sum(c["benchmark"] == name for c in conversations),
                **{m: per_set[m][name] for m in methods},
            }
            for name in per_set[methods[-1]]
            if name != HELD_OUT
        },
    }
    write_jsonl(
        out_outputs,
        [
            {**{f: o[f] for f in STORED_FIELDS}, **{f: o[f] for f in STORED_IF_PRESENT if f in o}}
            for o in stored
        ],
    )
    write_table(results, out_csv)
    plot_per_position(results, out_png)
    if out_sets:
        write_set_table(per_set, out_sets)
    if out_sets_png:
        plot_sets(per_set, out_sets_png, k)
    requests = request_rows(stored)
    if out_requests:
        write_requests(requests, out_requests)
    if out_request_png:
        plot_requests(requests, out_request_png, k)
    write_json(out_json, summary)  # last: the stage's output Snakemake waits for
    return summary


def _checked_tokenizer(target, metadata_path):
    """The target's tokenizer, once its chat template is the one the training data was made with."""
    # Lazy: tokenize brings numpy, and the Snakefile imports this package on every plan.
    from eaglenest.data.tokenize import chat_template_hash

    tokenizer = load_tokenizer(target.path, target.trust_remote_code)
    expected = read_json(metadata_path).get("chat_template_hash")
    actual = chat_template_hash(tokenizer)
    if expected and actual != expected:
        raise EaglenestError(
            f"the target's chat template (hash {actual}) differs from the one "
            f"the training data was tokenized with ({expected})",
            metadata_path,
        )
    return tokenizer
