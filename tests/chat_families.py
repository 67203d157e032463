"""Real chat-template families for the loss-mask tests, with an expectation written by hand.

Each family is a real model's chat template (verbatim, `data/templates/real/`, provenance in its
SOURCES.md), a tokenizer built here with that family's special tokens, and `expect`: a formatter
written from reading the template, independently of eaglenest's code, that returns the render as
segments ``(text, masked)`` and what becomes of each assistant turn's reasoning. The tests check
that the segments join to exactly the template's render (so the expectation is about the real
template) and then compare eaglenest's loss mask with it token by token.

What is masked, per assistant turn: what the model writes for it after the generation prompt,
as this render shows it: its reasoning block as rendered, the answer and the end-of-turn token;
not the role header, not a ``<think>\\n`` the generation prompt forces, not whitespace after the
end-of-turn token.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REAL = Path(__file__).parent / "data" / "templates" / "real"

R, DROP_T, DROP_U, NONE = "rendered", "dropped_by_template", "dropped_unsupported", "none"


def msg(role, content, reasoning=None):
    m = {"role": role, "content": content}
    if reasoning is not None:
        m["reasoning_content"] = reasoning
    return m


# The conversations every family is tested on.
CASES = {
    "single": [
        msg("user", "What is 2+2?"),
        msg("assistant", "The answer is 4.", "Two plus two.\nThat is four."),
    ],
    "multi": [
        msg("system", "Be brief."),
        msg("user", "Hi"),
        msg("assistant", "Hello!", "A greeting."),
        msg("user", "Capital of France?"),
        msg("assistant", "Paris.", "France's capital is Paris."),
        msg("user", "And Spain?"),
        msg("assistant", "Madrid.", "Spain: Madrid."),
    ],
    "empty_final": [msg("user", "Say nothing."), msg("assistant", "", "The user wants silence.")],
    "empty_final_plain": [msg("user", "Say nothing."), msg("assistant", "")],
    "empty_earlier": [msg("user", "a"), msg("assistant", ""), msg("user", "b"), msg("assistant", "ok")],
    "angle": [
        msg("user", "Bold?"),
        msg("assistant", "<b>x</b>"),
        msg("user", "HTML please"),
        msg("assistant", "<div>hi</div>", "Write a div."),
    ],
    "angle_plain": [msg("user", "HTML please"), msg("assistant", "<think>-like text is not a tag here")],
    "unicode": [
        msg("user", "Übersetze: 你好 👋"),
        msg("assistant", "Hallo 👋 — 你好 heißt hallo. é", "Chinese → German ✓"),
    ],
    "opens_with_assistant": [
        msg("assistant", "Welcome!"),
        msg("user", "Thanks"),
        msg("assistant", "You're welcome."),
    ],
}


@dataclass
class Family:
    name: str
    template: str  # file in REAL
    special: list[str]  # the family's special tokens, added to the tokenizer
    expect: Callable  # messages -> (segments, fates)
    passed_as: str | None = None  # how eaglenest should hand this template reasoning
    think_tokens: bool = False
    bos: str | None = None
    eos: str | None = None

    @property
    def path(self) -> Path:
        return REAL / self.template


def _turns(messages):
    return [i for i, m in enumerate(messages) if m["role"] == "assistant"]


def _last_user(messages):
    return max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)


# -- ChatML family: Qwen3, Qwen3 Thinking-2507, QwQ -------------------------------------------


def _chatml(messages, assistant):
    """The ChatML frame Qwen3, Qwen3-2507 and QwQ share: a leading system message, user turns
    '<|im_start|>user\n...<|im_end|>\n'; `assistant(i, m)` gives a turn's segments and fate."""
    seg, fates = [], []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            seg.append((f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n", 0))
            continue
        turn, fate = assistant(i, m)
        seg += [*turn, ("\n", 0)]
        fates.append(fate)
    return seg, fates


def expect_qwen3(messages, forced_think=False):
    """Qwen3 (hybrid) and Qwen3-Thinking-2507: reasoning is rendered for turns after the last user
    message (the final turn); earlier turns lose it. 2507's generation prompt forces '<think>\\n'."""
    last_q = _last_user(messages)

    def assistant(i, m):
        r = m.get("reasoning_content")
        if i < last_q:
            return [("<|im_start|>assistant\n", 0), (f"{m['content']}<|im_end|>", 1)], DROP_T if r else NONE
        # the final turn: '<think>\nR\n</think>\n\nA', an empty think block without reasoning
        body = f"{(r or '').strip(chr(10))}\n</think>\n\n{m['content'].lstrip(chr(10))}<|im_end|>"
        if forced_think:
            return [("<|im_start|>assistant\n<think>\n", 0), (body, 1)], R if r else NONE
        return [("<|im_start|>assistant\n", 0), ("<think>\n" + body, 1)], R if r else NONE

    return _chatml(messages, assistant)


def expect_qwq(messages):
    """QwQ: no reasoning field; inline '<think>' text is kept in the final turn only (the template
    cuts it from earlier turns); the generation prompt forces '<think>\\n'."""
    last = len(messages) - 1

    def assistant(i, m):
        r = m.get("reasoning_content")
        if i == last and r:
            return [
                ("<|im_start|>assistant\n<think>\n", 0),
                (f"{r}\n</think>\n\n{m['content']}<|im_end|>", 1),
            ], R
        return [("<|im_start|>assistant\n", 0), (f"{m['content']}<|im_end|>", 1)], DROP_T if r else NONE

    return _chatml(messages, assistant)


# -- DeepSeek: R1 (distill) and V3.1 ------------------------------------------------------------

BOS_DS, EOS_DS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"


def expect_deepseek(messages, v3_1=False):
    """No reasoning field and inline text is cut: reasoning is dropped, the answer follows
    '<｜Assistant｜>' (V3.1 in non-thinking mode: '<｜Assistant｜></think>', its generation prompt)."""
    system = (
        "\n\n".join(m["content"] for m in messages if m["role"] == "system")
        if v3_1
        else next((m["content"] for m in reversed(messages) if m["role"] == "system"), "")
    )
    seg, fates = [(BOS_DS + system, 0)], []
    for m in messages:
        if m["role"] == "user":
            seg.append((f"<｜User｜>{m['content']}", 0))
        elif m["role"] == "assistant":
            header = "<｜Assistant｜></think>" if v3_1 else "<｜Assistant｜>"
            if v3_1 and seg and not seg[-1][0].startswith("<｜User｜>"):
                header = ""  # V3.1 writes the header only after a user turn
            seg += [(header, 0), (m["content"] + EOS_DS, 1)]
            fates.append(DROP_U if m.get("reasoning_content") else NONE)
    return seg, fates


# -- Kimi: K2 (instruct) and K2-Thinking -----------------------------------------------------


def expect_kimi(messages, thinking=False):
    """Kimi-K2: role headers '<|im_..|>role<|im_middle|>', turns end '<|im_end|>', a default system
    message when the first is not one. K2-Thinking writes '<think></think>' before every past
    answer and drops its reasoning (it keeps reasoning only in tool-calling turns)."""
    default = (
        "You are Kimi, an AI assistant created by Moonshot AI." if thinking else "You are a helpful assistant"
    )
    seg, fates = [], []
    if messages[0]["role"] != "system":
        seg.append((f"<|im_system|>system<|im_middle|>{default}<|im_end|>", 0))
    for m in messages:
        if m["role"] == "assistant":
            seg += [
                ("<|im_assistant|>assistant<|im_middle|>", 0),
                (("<think></think>" if thinking else "") + m["content"] + "<|im_end|>", 1),
            ]
            r = m.get("reasoning_content")
            fates.append((DROP_T if thinking else DROP_U) if r else NONE)
        else:
            tag = "im_system" if m["role"] == "system" else "im_user"
            seg.append((f"<|{tag}|>{m['role']}<|im_middle|>{m['content']}<|im_end|>", 0))
    return seg, fates


# -- Llama 3.x -----------------------------------------------------------------------------------


def expect_llama3(messages):
    """Llama 3.3: a system block with dates, every message trimmed and closed by '<|eot_id|>';
    no reasoning."""
    system = messages[0]["content"].strip() if messages[0]["role"] == "system" else ""
    seg = [
        (
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
            f"{system}<|eot_id|>",
            0,
        )
    ]
    fates = []
    for i, m in enumerate(messages):
        if m["role"] == "system" and i == 0:
            continue
        head = f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n"
        if m["role"] == "assistant":
            seg += [(head, 0), (m["content"].strip() + "<|eot_id|>", 1)]
            fates.append(DROP_U if m.get("reasoning_content") else NONE)
        else:
            seg.append((head + m["content"].strip() + "<|eot_id|>", 0))
    return seg, fates


# -- gpt-oss (harmony) --------------------------------------------------------------------------


def expect_gpt_oss(messages):
    """gpt-oss: reasoning goes in `thinking` and is rendered (analysis channel) for the final
    turn only; a past turn ends '<|end|>', the final one '<|return|>'."""
    today = datetime.date.today().strftime("%Y-%m-%d")
    seg = [
        (
            "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
            f"Knowledge cutoff: 2024-06\nCurrent date: {today}\n\nReasoning: medium\n\n"
            "# Valid channels: analysis, commentary, final. Channel must be included for every "
            "message.<|end|>",
            0,
        )
    ]
    loop = messages
    if messages[0]["role"] == "system":
        seg.append((f"<|start|>developer<|message|># Instructions\n\n{messages[0]['content']}\n\n<|end|>", 0))
        loop = messages[1:]
    fates = []
    for k, m in enumerate(loop):
        if m["role"] == "user":
            seg.append((f"<|start|>user<|message|>{m['content']}<|end|>", 0))
            continue
        r = m.get("reasoning_content")
        if k == len(loop) - 1:
            body = f"<|channel|>analysis<|message|>{r}<|end|><|start|>assistant" if r else ""
            seg += [
                ("<|start|>assistant", 0),
                (f"{body}<|channel|>final<|message|>{m['content']}<|return|>", 1),
            ]
            fates.append(R if r else NONE)
        else:
            seg += [("<|start|>assistant", 0), (f"<|channel|>final<|message|>{m['content']}<|end|>", 1)]
            fates.append(DROP_T if r else NONE)
    return seg, fates


CHATML = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
KIMI = ["<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<|im_end|>"]
DEEPSEEK = [BOS_DS, EOS_DS, "<｜User｜>", "<｜Assistant｜>"]

FAMILIES = [
    Family(
        "qwen3", "qwen3.jinja", CHATML, expect_qwen3, "reasoning_content", think_tokens=True, eos="<|im_end|>"
    ),
    Family(
        "qwen3_thinking_2507",
        "qwen3_thinking_2507.jinja",
        CHATML,
        lambda m: expect_qwen3(m, forced_think=True),
        "reasoning_content",
        think_tokens=True,
        eos="<|im_end|>",
    ),
    Family("qwq", "qwq.jinja", CHATML, expect_qwq, "inline", think_tokens=True, eos="<|im_end|>"),
    Family(
        "deepseek_r1_distill",
        "deepseek_r1_distill.jinja",
        DEEPSEEK,
        expect_deepseek,
        think_tokens=True,
        bos=BOS_DS,
        eos=EOS_DS,
    ),
    Family(
        "deepseek_v3_1",
        "deepseek_v3_1.jinja",
        DEEPSEEK,
        lambda m: expect_deepseek(m, v3_1=True),
        think_tokens=True,
        bos=BOS_DS,
        eos=EOS_DS,
    ),
    Family("kimi_k2", "kimi_k2.jinja", KIMI, expect_kimi, eos="<|im_end|>"),
    Family(
        "kimi_k2_thinking",
        "kimi_k2_thinking.jinja",
        KIMI,
        lambda m: expect_kimi(m, thinking=True),
        "reasoning_content",
        think_tokens=True,
        eos="<|im_end|>",
    ),
    Family(
        "llama3_3",
        "llama3_3.jinja",
        ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        expect_llama3,
        bos="<|begin_of_text|>",
        eos="<|eot_id|>",
    ),
    Family(
        "gpt_oss",
        "gpt_oss.jinja",
        ["<|start|>", "<|message|>", "<|end|>", "<|channel|>", "<|return|>", "<|call|>", "<|constrain|>"],
        expect_gpt_oss,
        "thinking",
        eos="<|return|>",
    ),
]
