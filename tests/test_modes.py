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


def test_evaluation_asks_each_held_out_prompt_in_its_mode_with_its_tools(tmp_path):
    """The request fields of a held-out prompt: its mode's switch (sent at the top level of the
    body: the OpenAI client flattens extra_body) and its tools, which it only answers."""
    from eaglenest.evaluation.evaluate import _mode_fields, load_eval_prompts

    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    path = tmp_path / "eval_prompts.jsonl"
    rows = [
        {"id": "a", "mode": "instant", "messages": [{"role": "user", "content": "hi"}], "tools": tools},
        {"id": "b", "mode": "thinking", "messages": [{"role": "user", "content": "hi"}]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    modes = [{"name": "thinking"}, {"name": "instant", "chat_template_kwargs": {"thinking": False}}]
    a, b = load_eval_prompts(path, modes)
    assert _mode_fields(a) == {
        "chat_template_kwargs": {"thinking": False},
        "tools": tools,
        "tool_choice": "none",
    }
    assert _mode_fields(b) == {}
    with pytest.raises(EaglenestError, match="mode 'instant' is not configured"):
        load_eval_prompts(path, [{"name": "thinking"}])
