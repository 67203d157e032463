"""Loss masks of tool loops and thinking modes on the real chat templates.

Each family's template is the model's own (tests/data/templates/real, SOURCES.md says where each
came from), rendered with a tools list and each mode its template has a switch for. The expected
render and mask come from `tool_families`, written by hand from reading each template, never
from eaglenest's code. Every check is token by token.
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import json
from unittest import mock

import pytest
import test_chat_templates
from test_chat_templates import assert_every_turn_masked, assert_tokens, expected_tokens, run_stage
from tool_families import (
    KIMI_CONVERSATIONS,
    TOOL_FAMILIES,
    TOOLS,
    ToolFamily,
    corpus,
    template_messages,
)

FAMILY = {f.name: f for f in TOOL_FAMILIES}


def build_tokenizer(fam: ToolFamily, folder):
    """`test_chat_templates.build_tokenizer`, trained on the tool conversations' text."""
    with mock.patch.object(test_chat_templates, "CORPUS", corpus()):
        return test_chat_templates.build_tokenizer(fam, folder)


@pytest.fixture(scope="module", params=TOOL_FAMILIES, ids=[f.name for f in TOOL_FAMILIES])
def family(request, tmp_path_factory):
    fam = request.param
    if not fam.path.exists():
        pytest.fail(f"missing template {fam.path}")
    folder = tmp_path_factory.mktemp(fam.name)
    return fam, build_tokenizer(fam, folder), folder


def render(tok, fam, conv, mode, fates, **kw):
    messages = template_messages(conv, fam.reasoning_field, fates, fam.args_as_string)
    return tok.apply_chat_template(messages, tools=TOOLS, tokenize=False, **fam.modes[mode], **kw)


def _row_id(conv: str, mode: str) -> str:
    return f"{conv}-{mode}"


def test_expectations_match_the_real_templates(family):
    """The hand-written expectation of every conversation in every mode is the template's own
    render (tools passed, arguments as dicts or, for DeepSeek-V3.1, strings)."""
    fam, tok, _ = family
    for conv_name, conv in fam.conversations.items():
        for mode, kwargs in fam.modes.items():
            segments, fates = fam.expect(conv, TOOLS, kwargs)
            assert render(tok, fam, conv, mode, fates) == "".join(t for t, _ in segments), (
                f"{fam.name}/{conv_name}/{mode}"
            )


# Templates whose calling turns no value anchors: gpt-oss writes the last call's function name
# into every tool result's header too (so a name is not unique), renders no answer beside a
# call's reasoning, and keeps only the first of parallel calls. Their rows are skipped and
# counted as template_mismatch, never masked by a guess.
UNPLACEABLE_CALLS = {"gpt_oss"}


def test_tokenize_stage_masks_tool_loops_as_the_template_writes_them(family, tmp_path):
    """eaglenest renders rows with tools and chat_template_kwargs and masks every assistant turn
    (reasoning, content, calls, end of turn) as the expectation says, token by token."""
    fam, tok, folder = family
    rows = [
        {"id": _row_id(c, mode), "messages": conv, "tools": TOOLS, "chat_template_kwargs": kwargs}
        for c, conv in fam.conversations.items()
        for mode, kwargs in fam.modes.items()
    ]
    if fam.name in UNPLACEABLE_CALLS:
        meta, data = run_stage(tmp_path, folder, rows)
        assert data == {} and meta["skipped"]["template_mismatch"] == len(rows)
        return
    meta, data = run_stage(tmp_path, folder, rows)
    n_turns = 0
    fates_seen = {"rendered": 0, "dropped_by_template": 0, "dropped_unsupported": 0}
    for c, conv in fam.conversations.items():
        for mode, kwargs in fam.modes.items():
            where = f"{fam.name}/{c}/{mode}"
            segments, fates = fam.expect(conv, TOOLS, kwargs)
            text, ids, mask = expected_tokens(tok, segments)
            assert_tokens(tok, data[_row_id(c, mode)], text, ids, mask, where)
            n_turns += len(fates)
            for f in fates:
                if f != "none":
                    fates_seen[f] += 1
    assert_every_turn_masked(meta, n_turns, fates_seen, fam.passed_as)


def _tok(name, tmp_path):
    fam = FAMILY[name]
    return fam, build_tokenizer(fam, tmp_path / name)


def test_switches_change_only_what_each_template_reads(tmp_path):
    """Qwen3's enable_thinking and DeepSeek-V3.1's thinking change only the generation prompt, so
    a finished conversation renders the same in both modes (the masks differ: what the prompt
    forces); gpt-oss's reasoning_effort changes only the system block's 'Reasoning:' line."""
    for name, modes in (
        ("qwen3", ("thinking", "no_thinking")),
        ("deepseek_v3_1", ("thinking", "no_thinking")),
    ):
        fam, tok = _tok(name, tmp_path)
        for conv in fam.conversations.values():
            fates = fam.expect(conv, TOOLS, {})[1]
            a, b = (render(tok, fam, conv, m, fates) for m in modes)
            assert a == b, name
            asked = conv[: next(i for i, m in enumerate(conv) if m["role"] == "user") + 1]
            pa, pb = (render(tok, fam, asked, m, [], add_generation_prompt=True) for m in modes)
            assert pa != pb, name
    fam, tok = _tok("gpt_oss", tmp_path)
    conv = fam.conversations["loop"]
    fates = fam.expect(conv, TOOLS, {})[1]
    low, high = (render(tok, fam, conv, m, fates) for m in ("low", "high"))
    assert low.replace("Reasoning: low\n", "Reasoning: high\n", 1) == high


def test_content_none_renders_as_empty_or_fails(tmp_path):
    """A tool-calling turn's content None renders exactly as "" where the template accepts it;
    Qwen3 (hybrid) and gpt-oss fail on it, so it must reach them as "" (as vLLM passes it)."""
    failing = set()
    for fam in TOOL_FAMILIES:
        tok = _tok(fam.name, tmp_path)[1]
        conv = fam.conversations["loop"]
        fates = fam.expect(conv, TOOLS, {})[1]
        assert any("tool_calls" in m and m["content"] is None for m in conv)
        messages = template_messages(conv, fam.reasoning_field, fates, fam.args_as_string)
        with_none = [
            {**m, "content": None} if "tool_calls" in m and not m["content"] else m for m in messages
        ]
        try:
            got = tok.apply_chat_template(with_none, tools=TOOLS, tokenize=False)
        except Exception:
            failing.add(fam.name)
            continue
        assert got == tok.apply_chat_template(messages, tools=TOOLS, tokenize=False), fam.name
    assert failing == {"qwen3", "gpt_oss"}


# -- Kimi-K2-Thinking ----------------------------------------------------------------------------


def test_kimi_renders_native_ids_and_the_reasoning_of_the_loop_in_flight(tmp_path):
    _, tok = _tok("kimi_k2_thinking", tmp_path)
    for name, conv in KIMI_CONVERSATIONS.items():
        text = tok.apply_chat_template(
            template_messages(conv, "reasoning_content", ["rendered"] * len(conv)),
            tools=TOOLS,
            tokenize=False,
        )
        calls = [c for m in conv for c in m.get("tool_calls") or []]
        for k, c in enumerate(calls):
            assert c["id"] == f"functions.{c['function']['name']}:{k}"
            assert f"<|tool_call_begin|>{c['id']}<|tool_call_argument_begin|>" in text, name
        for m in conv:
            if m["role"] == "tool":
                assert f"## Return of {m['tool_call_id']}\n{m['content']}<|im_end|>" in text, name
        # Reasoning is passed for every turn: the template keeps it only after the last
        # assistant turn without calls, and writes '<think></think>' for the finished ones.
        turns = [i for i, m in enumerate(conv) if m["role"] == "assistant"]
        finished = max(i for i in turns if not conv[i].get("tool_calls"))
        in_flight = [i for i in turns if i > finished]
        assert text.count("<think></think>") == len(turns) - len(in_flight), name
        for i in turns:
            r = conv[i].get("reasoning_content")
            if r:
                assert (f"<think>{r}</think>" in text) == (i in in_flight), f"{name}: turn {i}"
                assert (r in text) == (i in in_flight), f"{name}: turn {i}"
    assert KIMI_CONVERSATIONS["in_flight"][-1].get("tool_calls")  # a loop in flight was tested


# -- DeepSeek-V3.1 -------------------------------------------------------------------------------


def test_deepseek_v3_1_renders_arguments_as_given_and_no_prompt_after_a_tool_output(tmp_path):
    fam, tok = _tok("deepseek_v3_1", tmp_path)
    conv = json.loads(json.dumps(fam.conversations["loop"]))
    odd = '{ "city":"Paris" ,"units": "metric"}'  # not what any JSON encoder writes
    conv[2]["tool_calls"][0]["function"]["arguments"] = odd
    for mode, kwargs in fam.modes.items():
        fates = fam.expect(conv, TOOLS, kwargs)[1]
        text = render(tok, fam, conv, mode, fates)
        assert f"<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{odd}<｜tool▁call▁end｜>" in text
        for c in (c for m in conv for c in m.get("tool_calls") or []):
            assert f"{c['function']['name']}<｜tool▁sep｜>{c['function']['arguments']}" in text
        # Dict arguments, as vLLM hands them to other templates, do not render.
        with_dicts = template_messages(conv)
        with pytest.raises(TypeError):
            tok.apply_chat_template(with_dicts, tools=TOOLS, tokenize=False, **kwargs)
        # After a tool output the generation prompt adds nothing: the next turn has no header.
        for end in (i + 1 for i, m in enumerate(conv) if m["role"] == "tool"):
            history = conv[:end]
            fates = fam.expect(history, TOOLS, kwargs)[1]
            assert render(tok, fam, history, mode, fates, add_generation_prompt=True) == render(
                tok, fam, history, mode, fates
            ), f"{mode}: after message {end - 1}"


# -- Llama 3.3 -----------------------------------------------------------------------------------


def test_llama3_3_takes_one_call_per_turn(tmp_path):
    """Llama 3.3's template raises on parallel calls: its conversations make them one by one."""
    fam, tok = _tok("llama3_3", tmp_path)
    parallel = FAMILY["qwen3"].conversations["loop"]
    with pytest.raises(Exception, match="only supports single tool-calls"):
        tok.apply_chat_template(template_messages(parallel), tools=TOOLS, tokenize=False)
    assert all(len(m.get("tool_calls") or [0]) == 1 for conv in fam.conversations.values() for m in conv)


# -- served tool loops: one row where the template appends, one per generation where it does not


def _served_loop(tok, appends: bool):
    """A two-generation tool loop as regeneration records it: the first prompt is the Qwen3
    template's render of the question, then ids the model emitted (its call, ended by the
    end-of-turn token), the tool result, its answer."""
    user = {"role": "user", "content": "Weather in Paris?"}
    call = {
        "id": "c0",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    messages = [
        user,
        {"role": "assistant", "content": "", "reasoning_content": "Ask the tool.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c0", "content": "Sunny"},
        {"role": "assistant", "content": "It is sunny.", "reasoning_content": "Done."},
    ]
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    p0 = tok.apply_chat_template([user], tools=TOOLS, add_generation_prompt=True, tokenize=False)
    c0 = ids(
        '<think>\nAsk the tool.\n</think>\n\n<tool_call>\n{"name": "get_weather"}\n</tool_call><|im_end|>'
    )
    tool_block = ids(
        "\n<|im_start|>user\n<tool_response>\nSunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    c1 = ids("<think>\nDone.\n</think>\n\nIt is sunny.<|im_end|>")
    p1 = ids(p0) + (c0 if appends else c0[:-1]) + tool_block
    generations = [
        {
            "messages_before": 1,
            "prompt_token_ids": ids(p0),
            "completion_token_ids": c0,
            "finish_reason": "tool_calls",
        },
        {"messages_before": 3, "prompt_token_ids": p1, "completion_token_ids": c1, "finish_reason": "stop"},
    ]
    row = {"id": "loop", "messages": messages, "tools": TOOLS, "generations": generations, "mode": "thinking"}
    return row, ids(p0), c0, tool_block, c1


@pytest.mark.parametrize("appends", [True, False])
def test_served_tool_loop_trains_each_generation_the_target_emitted(tmp_path, appends):
    fam = FAMILY["qwen3"]
    tok = build_tokenizer(fam, tmp_path / "qwen3")
    row, p0, c0, tool_block, c1 = _served_loop(tok, appends)
    meta, data = run_stage(tmp_path, tmp_path / "qwen3", [row])
    assert meta["generations"] == 2 and meta["records"]["by_class"] == {"tool": 1}
    if appends:  # one row, both answers supervised, the prompt and the tool result not
        assert list(data) == ["loop"]
        got = data["loop"]
        assert got["input_ids"] == p0 + c0 + tool_block + c1
        assert got["loss_mask"] == [0] * len(p0) + [1] * len(c0) + [0] * len(tool_block) + [1] * len(c1)
    else:  # the second prompt does not extend the first: one row per generation
        assert sorted(data) == ["loop", "loop~0"]
        assert data["loop~0"]["input_ids"] == p0 + c0
        assert data["loop~0"]["loss_mask"] == [0] * len(p0) + [1] * len(c0)
        second = row["generations"][1]["prompt_token_ids"]
        assert data["loop"]["input_ids"] == second + c1
        assert data["loop"]["loss_mask"] == [0] * len(second) + [1] * len(c1)
    # Kinds: up to </think> reasoning, from <tool_call> the call, the rest the answer.
    think_end = c0.index(tok.convert_tokens_to_ids("</think>")) + 1
    call_start = c0.index(tok.convert_tokens_to_ids("<tool_call>"))
    reasoning = think_end + c1.index(tok.convert_tokens_to_ids("</think>")) + 1
    kinds = meta["supervised_tokens"]["by_mode"]["thinking"]
    assert kinds == {
        "reasoning": reasoning,
        "answer": (call_start - think_end) + len(c1) - (reasoning - think_end),
        "tool_call": len(c0) - call_start,
    }
    assert "<tool_call>" in meta["supervised_special_tokens"].values()
