"""Serving modes: the template switches each real template reads, and a switch that changes
nothing refused, at planning, before regeneration's server starts, and in tokenize."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import json
import subprocess
import sys

import pytest
import yaml
from chat_families import FAMILIES
from test_chat_templates import build_tokenizer, run_stage

from eaglenest.core.errors import EaglenestError
from eaglenest.data.modes import check_switches, checked_modes, template_switches
from eaglenest.target.kimi_mini import ASSETS

REAL = {f.name: f for f in FAMILIES}


@pytest.mark.parametrize(
    ("template", "reads"),
    [
        ("qwen3.jinja", {"enable_thinking"}),
        ("deepseek_v3_1.jinja", {"thinking"}),
        ("kimi_k2_thinking.jinja", set()),
        ("qwen3_thinking_2507.jinja", set()),
    ],
)
def test_switches_of_real_templates(template, reads):
    text = (REAL["qwen3"].path.parent / template).read_text()
    assert template_switches(text) == reads


def test_gpt_oss_reads_reasoning_effort_and_the_miniature_reads_thinking():
    assert "reasoning_effort" in template_switches((REAL["qwen3"].path.parent / "gpt_oss.jinja").read_text())
    assert template_switches((ASSETS / "chat_template.jinja").read_text()) == {"thinking"}


def test_a_switch_the_template_never_reads_is_refused_naming_the_ones_it_reads():
    deepseek = (REAL["qwen3"].path.parent / "deepseek_v3_1.jinja").read_text()
    qwen_style = checked_modes([{"name": "instant", "chat_template_kwargs": {"enable_thinking": False}}])
    with pytest.raises(EaglenestError, match=r"mode 'instant': chat_template_kwargs enable_thinking: .*DeepSeek.*"
                       r"never reads it.*the switches it reads: thinking"):  # fmt: skip
        check_switches(qwen_style, deepseek, "DeepSeek-V3.1")
    check_switches(
        checked_modes([{"name": "instant", "chat_template_kwargs": {"thinking": False}}]), deepseek, "x"
    )


def test_tokenize_refuses_a_row_whose_switch_the_template_never_reads(tmp_path):
    kimi = next(f for f in FAMILIES if f.template == "kimi_k2_thinking.jinja")
    folder = tmp_path / "kimi"
    build_tokenizer(kimi, folder)
    row = {
        "id": "r",
        "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
        "chat_template_kwargs": {"thinking": False},
    }
    with pytest.raises(EaglenestError, match="never reads it"):
        run_stage(tmp_path, folder, [row])
    assert not (tmp_path / "out" / "data.jsonl").exists()


def test_planning_refuses_a_mode_the_miniature_template_ignores(tmp_path):
    """From the repository root, as a user plans: the miniature's template reads `thinking`;
    Qwen's `enable_thinking` would change nothing and stops the plan."""
    repo = REAL["qwen3"].path.parents[4]
    cfg = yaml.safe_load((repo / "config" / "kimi-mini.yaml").read_text())
    cfg["run_dir"] = str(tmp_path / "run")
    cfg["modes"] = [{"name": "instant", "chat_template_kwargs": {"enable_thinking": False}}]
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--configfile", str(config)],
        cwd=repo,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
        capture_output=True,
        text=True,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "chat_template_kwargs enable_thinking" in out and "the switches it reads: thinking" in out, out[
        -2000:
    ]
    assert str(config) in out


def test_evaluation_asks_every_held_out_prompt_in_every_mode_with_its_tools(tmp_path):
    """Every held-out prompt is asked in each configured mode, whatever mode it trained in: the
    mode's switch goes at the top level of the request body (the OpenAI client flattens
    extra_body), with the prompt's tools, which it only answers."""
    from eaglenest.evaluation.asking import request_fields
    from eaglenest.evaluation.evaluate import evaluated_conversations

    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    path = tmp_path / "eval_prompts.jsonl"
    rows = [
        {"id": "a", "mode": "instant", "messages": [{"role": "user", "content": "hi"}], "tools": tools},
        {"id": "b", "mode": "thinking", "messages": [{"role": "user", "content": "hi"}]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    modes = [{"name": "thinking"}, {"name": "instant", "chat_template_kwargs": {"thinking": False}}]
    asked = evaluated_conversations(path, None, modes)
    assert [(c["id"], c["mode"]) for c in asked] == [
        ("a", "thinking"),
        ("b", "thinking"),
        ("a", "instant"),
        ("b", "instant"),
    ]
    by = {(c["id"], c["mode"]): c for c in asked}
    assert request_fields(by[("a", "instant")]) == {
        "chat_template_kwargs": {"thinking": False},
        "tools": tools,
        "tool_choice": "none",
    }
    assert request_fields(by[("a", "thinking")]) == {"tools": tools, "tool_choice": "none"}
    assert request_fields(by[("b", "thinking")]) == {}


def test_a_recorded_evaluation_request_carries_its_mode_switch_at_the_top_level(tmp_path):
    """What the server receives, recorded: each mode's request (and the /tokenize call that
    checks its room) carries the mode's chat_template_kwargs at the top level of the body, where
    vLLM reads them, with the tools; the default mode's carries none."""
    from test_tool_loops import fake_server

    from eaglenest.evaluation.asking import ask_conversations, in_mode

    def script(body):
        if "add_generation_prompt" in body:  # /tokenize
            return {"count": 5, "max_model_len": 100}
        return {
            "id": "x", "object": "chat.completion", "model": "target", "created": 0,
            "choices": [{"index": 0, "finish_reason": "stop", "token_ids": [4],
                         "message": {"role": "assistant", "content": "ok"}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
        }  # fmt: skip

    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    held_out = [{"benchmark": "held_out", "id": "a", "category": "all", "tools": tools,
                 "messages": [{"role": "user", "content": "hi"}]}]  # fmt: skip
    modes = [
        {"name": "default", "chat_template_kwargs": {}},
        {"name": "instant", "chat_template_kwargs": {"thinking": False}},
    ]
    with fake_server(tmp_path, script) as (server, seen):
        for mode in modes:
            ask_conversations(
                server, in_mode(held_out, mode), {}, is_reference=True,
                max_tokens=4, concurrency=1, stall_timeout_s=30,
            )  # fmt: skip
    tokenize_default, chat_default, tokenize_instant, chat_instant = seen
    assert "chat_template_kwargs" not in chat_default and "chat_template_kwargs" not in tokenize_default
    for body in (tokenize_instant, chat_instant):
        assert body["chat_template_kwargs"] == {"thinking": False}
        assert body["tools"] == tools and body["tool_choice"] == "none"
    assert "extra_body" not in chat_instant and chat_instant["temperature"] == 0.0
