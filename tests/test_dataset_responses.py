"""Prompt sources that keep their own answers (`responses: dataset`): prepare_prompts keeps the
reply (reasoning and tool calls too) or drops and counts a row without one, planning refuses a
source whose first rows have none, regeneration passes the answers through without asking (or
starting) the server, and tokenize trains them exactly as it trains the same text regenerated, on
the real chat templates (tests/data/templates/real), token by token."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import contextlib
import json
from pathlib import Path

import numpy as np
import pytest
import test_chat_templates
import test_tool_templates
from chat_families import CASES, FAMILIES
from test_tool_loops import answer, fake_server
from tool_families import TOOL_FAMILIES, TOOLS

from eaglenest.core.errors import EaglenestError
from eaglenest.data.prompts import DROP_REASONS, check_prompt_sources, prepare_stage
from eaglenest.data.regenerate import ServerOnDemand, regenerate_responses
from eaglenest.data.tokenize import tokenize_stage

USER = {"role": "user", "content": "What is 2+2?"}
REPLY = {"role": "assistant", "content": "4.", "reasoning_content": "Two and two."}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def prepare(tmp_path, sources, eval_samples=0, modes=None):
    o = tmp_path / "prompts"
    stats = prepare_stage(
        sources, eval_samples, 0, o / "prompts.jsonl", o / "eval_prompts.jsonl", o / "stats.json", modes=modes
    )
    return stats, read_jsonl(o / "prompts.jsonl"), read_jsonl(o / "eval_prompts.jsonl")


def never_started():
    raise AssertionError("the server was started, with no prompt to send")


OFFLINE = ServerOnDemand("no-server", never_started)
ASK = {"target": "org/model", "sampling": {}, "concurrency": 2, "max_retries": 0, "request_timeout_s": 30.0}


def regenerate(tmp_path, server=OFFLINE, modes=None):
    out = tmp_path / "responses" / "raw_responses.jsonl"
    out.parent.mkdir(exist_ok=True)
    counts = regenerate_responses(
        server, tmp_path / "prompts" / "prompts.jsonl", out, tmp_path / "run", modes=modes, **ASK
    )
    return counts, read_jsonl(out)


def tokenize(tmp_path, target):
    out = tmp_path / "tokenized"
    meta = tokenize_stage(
        tmp_path / "responses" / "raw_responses.jsonl",
        target,
        4096,
        "truncate",
        out / "data.jsonl",
        out / "freq.pt",
        out / "metadata.json",
    )
    return meta, {r["id"]: r for r in read_jsonl(out / "data.jsonl")}


# ------------------------------------------------------------------------------ prepare_prompts

# One call of get_weather, as a dataset row records it (its id and argument string kept).
CALL = {
    "id": "c0",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}


def test_dataset_rows_keep_their_reply_and_rows_without_one_are_counted(tmp_path):
    call = CALL
    rows = [
        {"messages": [USER, REPLY]},
        {
            "messages": [
                USER | {"content": "thinking field"},
                {"role": "assistant", "content": "a", "thinking": "t"},
            ]
        },
        {
            "tools": TOOLS,
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": None, "reasoning": "Ask.", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c0", "content": "Sunny"},
                {"role": "assistant", "content": "Sunny."},
            ],
        },
        {
            "tools": TOOLS,
            "messages": [
                {"role": "user", "content": "Weather now?"},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c0", "content": "Sunny"},  # after the last turn: left out
            ],
        },
        {"messages": [USER | {"content": "no answer"}]},  # no_dataset_answer
        {"prompt": "a bare prompt"},  # no_dataset_answer
        {
            "messages": [USER | {"content": "x"}, REPLY, {"role": "user", "content": "and?"}]
        },  # no_dataset_answer
        {"messages": [USER | {"content": "empty"}, {"role": "assistant", "content": "  "}]},  # empty_content
    ]
    src = write_jsonl(tmp_path / "chats.jsonl", rows)
    other = write_jsonl(tmp_path / "asked.jsonl", [{"messages": [USER | {"content": "asked"}, REPLY]}])
    stats, train, _ = prepare(
        tmp_path,
        [
            {"name": "chats", "type": "jsonl", "path": src, "responses": "dataset"},
            {"name": "asked", "type": "jsonl", "path": other},
        ],
    )
    kept = {r["messages"][-1]["content"]: r for r in train}
    assert kept["What is 2+2?"]["answer"] == [REPLY] and kept["What is 2+2?"]["responses"] == "dataset"
    assert kept["thinking field"]["answer"] == [
        {"role": "assistant", "content": "a", "reasoning_content": "t"}
    ]
    assert kept["Weather?"]["answer"] == [
        {"role": "assistant", "content": "", "reasoning_content": "Ask.", "tool_calls": [call]},
        {"role": "tool", "content": "Sunny", "tool_call_id": "c0"},
        {"role": "assistant", "content": "Sunny."},
    ]
    assert kept["Weather now?"]["answer"] == [{"role": "assistant", "content": "", "tool_calls": [call]}]
    assert kept["Weather now?"]["tools"] == TOOLS
    # The target answers the other source's prompt: no answer kept, no mark.
    assert "answer" not in kept["asked"] and "responses" not in kept["asked"]
    dropped = stats["sources"]["chats"]["dropped"]
    assert dropped == {k: {"no_dataset_answer": 3, "empty_content": 1}.get(k, 0) for k in DROP_REASONS}
    assert (
        stats["sources"]["chats"]["responses"] == "dataset"
        and stats["sources"]["asked"]["responses"] == "target"
    )
    assert stats["responses"] == {"target": 1, "dataset": 4}


def test_a_dataset_rows_tool_loop_is_its_answer(tmp_path):
    call = CALL
    loop = [
        {"role": "assistant", "content": "", "reasoning_content": "Ask.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c0", "content": "Sunny", "name": "get_weather"},
        {"role": "assistant", "content": "Sunny."},
    ]
    src = write_jsonl(tmp_path / "loop.jsonl", [{"tools": TOOLS, "messages": [USER, *loop]}])
    _, (row,), _ = prepare(tmp_path, [{"name": "l", "type": "jsonl", "path": src, "responses": "dataset"}])
    assert row["messages"] == [USER] and row["answer"] == loop


def test_held_out_prompts_keep_only_the_prompt(tmp_path):
    src = write_jsonl(
        tmp_path / "d.jsonl", [{"messages": [USER | {"content": f"q{k}"}, REPLY]} for k in range(6)]
    )
    _, train, evals = prepare(
        tmp_path, [{"name": "d", "type": "jsonl", "path": src, "responses": "dataset"}], 2
    )
    assert len(train) == 4 and all("answer" in r for r in train)
    assert len(evals) == 2 and all(set(r) == {"id", "source", "mode", "messages"} for r in evals)


# ------------------------------------------------------------------------------ planning


def test_planning_refuses_a_dataset_source_whose_first_rows_have_no_answer(tmp_path):
    bare = write_jsonl(tmp_path / "bare.jsonl", [{"prompt": f"q{k}"} for k in range(300)])
    with pytest.raises(EaglenestError) as e:
        check_prompt_sources([{"name": "bare", "type": "jsonl", "path": bare, "responses": "dataset"}])
    assert str(e.value).startswith(f"{bare}: prompts source 'bare' asks for the dataset's own answers")
    assert "none of its first 200 rows has one" in str(e.value)
    # The same file answered by the target plans; so does a file with an answer among its first rows.
    check_prompt_sources([{"name": "bare", "type": "jsonl", "path": bare}])
    late = write_jsonl(
        tmp_path / "late.jsonl", [{"prompt": f"q{k}"} for k in range(199)] + [{"messages": [USER, REPLY]}]
    )
    check_prompt_sources([{"name": "late", "type": "jsonl", "path": late, "responses": "dataset"}])
    # Only the first records are read: an answer after them is not looked for.
    with pytest.raises(EaglenestError, match="first 10 rows"):
        check_prompt_sources([{"name": "late", "type": "jsonl", "path": late, "responses": "dataset"}], 10)


def test_planning_reads_the_start_of_a_sharegpt_file_and_refuses_bfcl_answers(tmp_path):
    # A truncated ShareGPT array whose first records are prompts only: refused from its start,
    # without reading to the break; one with a gpt turn plans.
    human = {"id": "a", "conversations": [{"from": "human", "value": "hi"}]}
    answered = {
        "id": "b",
        "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}],
    }
    for records, ok in (([human] * 250, False), ([human, answered] + [human] * 248, True)):
        path = tmp_path / "sg.json"
        path.write_text(json.dumps(records)[:-5])
        src = {"name": "sg", "type": "sharegpt", "path": str(path), "responses": "dataset"}
        if ok:
            check_prompt_sources([src])
        else:
            with pytest.raises(
                EaglenestError, match=r"prompts source 'sg' asks for the dataset's own answers"
            ):
                check_prompt_sources([src])
    with pytest.raises(EaglenestError, match="prompts source 'bfcl' asks for the dataset's own answers"):
        check_prompt_sources([{"name": "bfcl", "type": "bfcl", "responses": "dataset"}])
    with pytest.raises(EaglenestError, match="'responses' must be one of target, dataset"):
        check_prompt_sources([{"name": "x", "type": "bundled", "responses": "human"}])
    with pytest.raises(EaglenestError, match="file does not exist"):
        check_prompt_sources([{"name": "x", "type": "sharegpt", "path": str(tmp_path / "gone.json")}])


def test_planning_calls_the_check():
    """rules/common.smk refuses such a config at planning, naming the config files."""
    common = (Path(__file__).parents[1] / "rules" / "common.smk").read_text()
    assert 'check_prompt_sources(config["prompts"]["sources"])' in common


# ------------------------------------------------------------------------------ regeneration


def test_regeneration_passes_dataset_answers_through_without_a_server(tmp_path):
    src = write_jsonl(tmp_path / "d.jsonl", [{"tools": TOOLS, "messages": [USER, REPLY]}])
    modes = [{"name": "thinking", "chat_template_kwargs": {"enable_thinking": True}}]
    prepare(tmp_path, [{"name": "d", "type": "jsonl", "path": src, "responses": "dataset"}], modes=modes)
    counts, (row,) = regenerate(tmp_path, modes=modes)  # OFFLINE raises if it is started
    assert row == {
        "id": row["prompt_id"],
        "prompt_id": row["prompt_id"],
        "messages": [USER, REPLY],
        "generations": [],
        "cut": None,
        "mode": "thinking",
        "responses": "dataset",
        "chat_template_kwargs": {"enable_thinking": True},
        "tools": TOOLS,
    }
    assert (counts["prompts"], counts["from_dataset"], counts["sent"], counts["resumed"]) == (1, 1, 0, 0)
    assert counts["answered"] == 1 and counts["generations"] == 0


def test_a_mixed_run_sends_only_the_targets_prompts_and_the_origin_decides_on_resume(tmp_path):
    asked = write_jsonl(tmp_path / "asked.jsonl", [{"prompt": "asked"}])
    shipped = write_jsonl(tmp_path / "shipped.jsonl", [{"messages": [USER, REPLY]}])
    sources = [
        {"name": "asked", "type": "jsonl", "path": asked},
        {"name": "shipped", "type": "jsonl", "path": shipped, "responses": "dataset"},
    ]
    prepare(tmp_path, sources)
    with fake_server(tmp_path, lambda body: answer("From the target.")) as (server, seen):
        counts, rows = regenerate(tmp_path, server)
    assert [b["messages"][-1]["content"] for b in seen] == ["asked"]  # the dataset prompt is not sent
    assert [r["messages"][-1]["content"] for r in rows] == ["From the target.", "4."]
    assert [r.get("responses") for r in rows] == [None, "dataset"]
    assert (counts["sent"], counts["from_dataset"], counts["generations"]) == (1, 1, 1)
    # Rerun: the asked prompt's answer is in the progress file, nothing to send, no server.
    counts, again = regenerate(tmp_path, ServerOnDemand(server.key, never_started))
    assert again == rows and (counts["sent"], counts["resumed"]) == (0, 1)
    # Both switched: the prompt the target answered now has its dataset's answer (whatever the
    # progress holds), and the one the dataset answered is sent to the target.
    swapped = [
        {**sources[0], "responses": "dataset"},
        {k: v for k, v in sources[1].items() if k != "responses"},
    ]
    write_jsonl(tmp_path / "asked.jsonl", [{"messages": [{"role": "user", "content": "asked"}, REPLY]}])
    prepare(tmp_path, swapped)
    with fake_server(tmp_path, lambda body: answer("Now the target's.")) as (server, seen):
        counts, rows = regenerate(tmp_path, ServerOnDemand(server.key, lambda: _serving(server)))
    assert [b["messages"][-1]["content"] for b in seen] == ["What is 2+2?"]
    assert [(r["messages"][-1]["content"], r.get("responses")) for r in rows] == [
        ("4.", "dataset"),
        ("Now the target's.", None),
    ]


def _serving(server):
    return contextlib.nullcontext(server)


# ------------------------------------------------------------------------------ tokenize

# DeepSeek-R1's template cannot render a past answer as the model writes it: its generation prompt
# forces "<think>\n" and it cuts every turn's reasoning, so a rendered answer differs from a served
# one there whatever its origin (the loss-mask tests cover how it is masked).
SAME_AS_SERVED = [f for f in FAMILIES if f.name != "deepseek_r1_distill"]


@pytest.mark.parametrize("fam", SAME_AS_SERVED, ids=[f.name for f in SAME_AS_SERVED])
def test_a_dataset_answer_trains_exactly_as_the_same_text_regenerated(fam, tmp_path):
    """The same conversation, its last answer once shipped by the dataset and once regenerated by
    the target (a server that emits the template's own tokens for it: the masked segment of the
    hand-written expectation), through prepare, regenerate and tokenize: the same input_ids and the
    same loss mask, earlier turns included."""
    folder = tmp_path / "target"
    tok = test_chat_templates.build_tokenizer(fam, folder)
    conv = [  # as a dataset has them: earlier turns without reasoning, the last one with it
        {k: v for k, v in m.items() if k != "reasoning_content" or i == len(CASES["multi"]) - 1}
        for i, m in enumerate(CASES["multi"])
    ]
    segments, _ = fam.expect(conv)
    last = max(k for k, (_, masked) in enumerate(segments) if masked)

    def ids(text):
        return tok(text, add_special_tokens=False)["input_ids"]

    prompt_ids = ids(tok.apply_chat_template(conv[:-1], tokenize=False, add_generation_prompt=True))
    completion_ids = ids(segments[last][0])
    final = conv[-1]
    served = answer(
        final["content"],
        reasoning=final["reasoning_content"],
        prompt_ids=prompt_ids,
        token_ids=completion_ids,
    )
    data, metas = {}, {}
    for origin in ("dataset", "target"):
        run = tmp_path / origin
        src = {
            "name": "d",
            "type": "jsonl",
            "path": write_jsonl(tmp_path / "conv.jsonl", [{"messages": conv}]),
        }
        if origin == "dataset":
            src["responses"] = "dataset"
        prepare(run, [src])
        if origin == "dataset":
            regenerate(run)
        else:
            with fake_server(run, lambda body: served) as (server, _):
                regenerate(run, server)
        metas[origin], rows = tokenize(run, folder)
        (data[origin],) = rows.values()
    assert data["dataset"]["input_ids"] == prompt_ids + completion_ids
    assert data["dataset"] == data["target"], fam.name
    assert sum(data["dataset"]["loss_mask"][: len(prompt_ids)]) > 0  # earlier answers trained too
    assert metas["dataset"]["mask_method"] == {"served_token_ids": 0, "template_render": 1}
    assert metas["target"]["mask_method"] == {"served_token_ids": 1, "template_render": 0}
    for origin, meta in metas.items():
        other = "target" if origin == "dataset" else "dataset"
        assert meta["records"]["by_responses"] == {origin: 1, other: 0}
        by_origin = meta["supervised_tokens"]["by_responses"]
        assert sum(by_origin[origin].values()) == sum(data[origin]["loss_mask"]) == meta["tokens_loss_masked"]
        assert sum(by_origin[other].values()) == 0


# Templates whose calling turns no value anchors (see test_tool_templates.UNPLACEABLE_CALLS).
PLACEABLE = [f for f in TOOL_FAMILIES if f.name not in test_tool_templates.UNPLACEABLE_CALLS]


@pytest.mark.parametrize("fam", PLACEABLE, ids=[f.name for f in PLACEABLE])
def test_dataset_tool_loops_are_masked_as_the_template_writes_them(fam, tmp_path):
    """Dataset rows with tools, calls, results and reasoning, in each mode the template has:
    every assistant turn masked as the hand-written expectation says, the row ending at the end of
    its last turn."""
    folder = tmp_path / "target"
    tok = test_tool_templates.build_tokenizer(fam, folder)
    convs = {k: c for k, c in fam.conversations.items() if k != "in_flight"}  # ends on a call
    for mode, kwargs in fam.modes.items():
        run = tmp_path / mode
        rows = [{"tools": TOOLS, "mode": mode, "messages": c} for c in convs.values()]
        src = {
            "name": "d",
            "type": "jsonl",
            "path": write_jsonl(run.with_suffix(".jsonl"), rows),
            "responses": "dataset",
        }
        modes = [{"name": m, "chat_template_kwargs": kw} for m, kw in fam.modes.items()]
        _, prompts, _ = prepare(run, [src], modes=modes)
        regenerate(run, modes=modes)
        meta, data = tokenize(run, folder)
        assert len(data) == len(convs) and meta["records"]["by_responses"]["dataset"] == len(convs)
        by_question = {p["messages"][-1]["content"]: p["id"] for p in prompts}
        for name, conv in convs.items():
            where = f"{fam.name}/{name}/{mode}"
            question = [m for m in conv if m["role"] == "user"][-1]["content"]
            segments, _ = fam.expect(conv, TOOLS, kwargs)
            _, ids, mask = test_chat_templates.expected_tokens(tok, segments)
            end = int(np.flatnonzero(mask)[-1]) + 1  # as a served row ends
            row = data[by_question[question]]
            assert row["input_ids"] == ids[:end].tolist(), where
            assert row["loss_mask"] == mask[:end].tolist(), where
