"""Acceptance inside the spans of an answer (reasoning, answer, tool calls), placed from vLLM's
per-step accepted counts (`--per-request-spec-decode-metrics detailed`)."""

import json
import random
from pathlib import Path

import pytest

from eaglenest.evaluation.spans import response_spans, span_figures

DATA = Path(__file__).resolve().parent / "data"


def simulate(kinds: list[str], rng, k: int, drafts_every_step: bool):
    """Decoding simulated step by step, its metrics kept by vLLM's own class in `detailed`
    mode; a stop at the end of `kinds` cuts the last step's tokens, as vLLM does after counting
    them accepted. Returns the metrics and the true counts per span (each step given to the
    span of the first token it yields)."""
    from vllm.v1.metrics.stats import RequestSpecDecodeMetrics

    metrics = RequestSpecDecodeMetrics.new(k)
    truth = {kind: {"tokens": 0, "steps": 0, "accepted_tokens": 0} for kind in set(kinds)}
    truth[kinds[0]].update(tokens=1, steps=1)
    produced = 1
    while produced < len(kinds):
        kind = kinds[produced]
        if drafts_every_step or rng.random() < 0.6:
            accepted = rng.choice([0, 1, 2, 3, 3, 3])
            metrics.observe(num_draft_tokens=k, num_accepted=accepted, detailed=True)
        else:
            accepted = 0
        made = min(accepted + 1, len(kinds) - produced)
        truth[kind]["tokens"] += made
        truth[kind]["steps"] += 1
        truth[kind]["accepted_tokens"] += accepted if drafts_every_step else 0
        produced += made
    return metrics.to_dict(), truth


def answer_kinds(rng) -> list[str]:
    """Reasoning, then an answer, then maybe a tool call: the order a served answer takes."""
    kinds = ["reasoning"] * rng.randint(0, 30) + ["answer"] * rng.randint(1, 30)
    return kinds + ["tool_call"] * rng.choice([0, 0, rng.randint(1, 20)])


def test_every_step_placed_where_every_step_drafts():
    """EAGLE-style drafting: every decode step drafts, so every step is placed, and each span's
    tokens, steps and accepted drafts are the true ones, the cut last step included."""
    rng = random.Random(0)
    for _ in range(1000):
        kinds = answer_kinds(rng)
        spec, truth = simulate(kinds, rng, 3, drafts_every_step=True)
        spans = response_spans(kinds, spec)
        assert spans is not None
        for kind, counts in truth.items():
            assert spans[kind]["tokens"] == counts["tokens"] and spans[kind]["steps"] == counts["steps"]
            assert spans[kind]["accepted_tokens"] == counts["accepted_tokens"]
        assert sum(s["tokens"] for s in spans.values()) == len(kinds)


def test_a_stop_can_even_out_unlisted_steps_so_skipping_drafters_are_not_attributed():
    """n-gram decodes steps that draft nothing, which vLLM leaves out of its per-step list; a
    stop that cuts the last step can make the counts add up all the same, with every step after
    an unlisted one misplaced. So a method that skips drafting is never attributed (evaluation
    passes drafts_every_step=False for it), and the counts alone would not have caught it."""
    rng = random.Random(1)
    misplaced = 0
    for _ in range(2000):
        kinds = answer_kinds(rng)
        spec, truth = simulate(kinds, rng, 3, drafts_every_step=False)
        spans = response_spans(kinds, spec)
        if spans is not None and {k: (v["tokens"], v["steps"]) for k, v in spans.items()} != {
            k: (v["tokens"], v["steps"]) for k, v in truth.items()
        }:
            misplaced += 1
    assert misplaced > 0
    assert response_spans(["answer"] * 5, {"num_spec_steps": 2}) is None  # summary level: no list


def test_span_figures_pool_attributed_requests_and_count_the_rest():
    a = {"spec": {"x": 1}, "spans": {
        "reasoning": {"tokens": 9, "steps": 3, "drafting_steps": 3, "accepted_tokens": 6, "draft_tokens": 9},
        "answer": {"tokens": 4, "steps": 2, "drafting_steps": 1, "accepted_tokens": 2, "draft_tokens": 3}}}  # fmt: skip
    b = {"spec": {"x": 1}, "spans": None}
    figures = span_figures([a, b, {"spec": None}])
    assert figures["requests"] == 2 and figures["requests_attributed"] == 1
    assert figures["kinds"]["reasoning"]["mean_acceptance_length"] == 3.0
    assert figures["kinds"]["answer"]["mean_acceptance_length_per_draft"] == 3.0
    assert "tool_call" not in figures["kinds"]
    assert span_figures([{"spec": None}]) is None


def test_a_recorded_response_is_placed_step_by_step():
    """vLLM's own body for an EAGLE-3 answer that stopped inside a verify step (the default
    run's tiny Llama: no reasoning, no calls): every token is placed, in one span, and its steps
    are the prefill and each verify step."""
    recorded = json.loads((DATA / "vllm_chat_response_stops_mid_step.json").read_text())
    spec = recorded["metrics"]["speculative_decoding"]
    tokens = len(recorded["choices"][0]["token_ids"])
    spans = response_spans(["answer"] * tokens, spec)
    assert spans["answer"]["tokens"] == tokens
    assert spans["answer"]["steps"] == 1 + len(spec["per_step_accepted"])
    assert spans["answer"]["accepted_tokens"] == spec["num_accepted_draft_tokens"]
    # Placed by the token each step starts from: a reasoning first half takes the steps there.
    half = ["reasoning"] * (tokens // 2) + ["answer"] * (tokens - tokens // 2)
    split = response_spans(half, spec)
    assert split["reasoning"]["tokens"] + split["answer"]["tokens"] == tokens
    assert split["reasoning"]["steps"] + split["answer"]["steps"] == 1 + len(spec["per_step_accepted"])
    assert split["reasoning"]["tokens"] == pytest.approx(tokens // 2, abs=3)
