"""Tool loops and thinking modes on real chat templates, with expectations written by hand.

The companion of `chat_families` for conversations that call tools. Each family is a real model's
chat template (verbatim, `data/templates/real/`, provenance in its SOURCES.md) with the modes its
template has a switch for; `expect(messages, tools, mode)` is a formatter written from reading the
template, independently of eaglenest's code, that returns the render as segments
``(text, masked)`` and what became of each assistant turn's reasoning.

Conversations are OpenAI-format rows: assistant tool calls carry their arguments as a JSON string
and reasoning in ``reasoning_content``. They are rendered as eaglenest renders them:
``apply_chat_template(messages, tools=tools, **mode)``, with a tool call's arguments parsed to a
dict as vLLM's server does, except for DeepSeek-V3.1, whose template concatenates them as strings;
an assistant content of None is rendered as "" (vLLM does the same), and reasoning is handed to the
template in the field it reads (gpt-oss: ``thinking``), only for turns whose reasoning it renders.

What is masked, per assistant turn (multi-turn policy "all"): what the model writes for that turn
after the generation prompt, as this render shows it: its reasoning block as rendered (or the empty
think block the template writes for a past turn), its content, its tool-call markup and its
end-of-turn token(s). Not masked: role headers, what the generation prompt itself forces, the
whitespace after the end-of-turn token, system and user text, the tools declaration, tool results
and their wrappers. Where a template writes no header before an assistant turn (DeepSeek-V3.1
after a tool output), the turn starts right after the previous segment.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from chat_families import BOS_DS, CHATML, DEEPSEEK, DROP_T, DROP_U, EOS_DS, KIMI, NONE, REAL, R

# -- Tools and conversations ---------------------------------------------------------------------

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "The city name."}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Get the current time in a time zone.",
            "parameters": {
                "type": "object",
                "properties": {"tz": {"type": "string", "description": "An IANA time zone."}},
                "required": ["tz"],
            },
        },
    },
]

SYSTEM = "You are a helpful assistant with tools."


def _user(text):
    return {"role": "user", "content": text}


def _answer(content, reasoning=None):
    m = {"role": "assistant", "content": content}
    if reasoning is not None:
        m["reasoning_content"] = reasoning
    return m


def _conversations(kimi_ids: bool, parallel: bool) -> dict[str, list[dict]]:
    """The conversations, with Kimi's native call ids (``functions.NAME:INDEX``, the index
    counting calls over the conversation) or OpenAI-style ones, and with parallel calls or (for
    templates that take one call per turn) the same calls made one after the other."""
    count = [0]

    def call(name, args):
        idx = count[0]
        count[0] += 1
        return {
            "id": f"functions.{name}:{idx}" if kimi_ids else f"call_{idx}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)},
        }

    def calls(content, reasoning, *called):
        m = _answer(content, reasoning)
        m["tool_calls"] = list(called)
        return m

    def results(m, *outputs):
        return [
            {"role": "tool", "tool_call_id": c["id"], "name": c["function"]["name"], "content": out}
            for c, out in zip(m["tool_calls"], outputs, strict=True)
        ]

    def round_(content, reasoning, called, outputs, then=None):
        """One round: a turn with its calls, then their results; made one call per turn when
        parallel calls are not allowed (the later turns reasoning `then`)."""
        if parallel or len(called) == 1:
            m = calls(content, reasoning, *called)
            return [m, *results(m, *outputs)]
        out = []
        for k, (c, o) in enumerate(zip(called, outputs, strict=True)):
            m = calls(content, reasoning if k == 0 else then, c)
            out += [m, *results(m, o)]
        return out

    convs = {}
    # (a) A two-round loop: one call ("" content), a parallel pair (None content), the answer.
    convs["loop"] = [
        {"role": "system", "content": SYSTEM},
        _user("Is it warm in Paris today? And what time is it in Tokyo?"),
        *round_(
            "",
            "The user asks two things. First the weather in Paris.",
            [call("get_weather", {"city": "Paris"})],
            ["18°C, sunny"],
        ),
        *round_(
            None,
            "Paris is 18°C. Now the time in Tokyo, and Berlin's weather to compare.",
            [call("get_time", {"tz": "Asia/Tokyo"}), call("get_weather", {"city": "Berlin"})],
            ["21:04", "12°C, rain"],
            then="Now Berlin.",
        ),
        _answer(
            "Yes, it is mild in Paris: 18°C and sunny (Berlin has 12°C and rain). In Tokyo it is 21:04.",
            "18°C is mild. Tokyo: 21:04.",
        ),
    ]
    count[0] = 0
    # (b) A finished loop, then a new user turn and a plain answer.
    convs["history"] = [
        _user("What's the weather in Paris?"),
        *round_("", "Look it up.", [call("get_weather", {"city": "Paris"})], ["18°C, sunny"]),
        _answer("It is 18°C and sunny in Paris.", "Report it."),
        _user("Thanks! Do I need an umbrella?"),
        _answer("No, it is sunny.", "Sunny, so no umbrella."),
    ]
    count[0] = 0
    # (c) A finished loop, a new user turn, and a loop still in flight: the row ends on a call.
    convs["in_flight"] = [
        _user("What's the weather in Paris?"),
        *round_("", "Look it up.", [call("get_weather", {"city": "Paris"})], ["18°C, sunny"]),
        _answer("It is 18°C and sunny in Paris.", "Report it."),
        _user("And the time in Tokyo and in Berlin?"),
        *round_(
            None,
            "Two time zones: call get_time twice at once.",
            [call("get_time", {"tz": "Asia/Tokyo"}), call("get_time", {"tz": "Europe/Berlin"})],
            ["21:04", "14:04"],
            then="Now Berlin.",
        ),
        calls("", "Got both. Check the weather in Tokyo too.", call("get_weather", {"city": "Tokyo"})),
    ]
    count[0] = 0
    # (d) A call with text before it and no reasoning anywhere.
    convs["content_and_call"] = [
        _user("Weather in Paris, please."),
        *round_("Let me look that up.", None, [call("get_weather", {"city": "Paris"})], ["18°C, sunny"]),
        _answer("18°C and sunny."),
    ]
    return convs


KIMI_CONVERSATIONS = _conversations(kimi_ids=True, parallel=True)
CONVERSATIONS = _conversations(kimi_ids=False, parallel=True)
# Llama 3.3's template raises on more than one call in a turn: the same calls, one per turn.
SINGLE_CALL_CONVERSATIONS = _conversations(kimi_ids=False, parallel=False)


def template_messages(messages, reasoning_field=None, fates=(), args_as_string=False):
    """The messages as the template gets them: arguments parsed (or left as strings), content None
    as "", reasoning in `reasoning_field` for the turns whose fate is "rendered"."""
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"][: len(fates)]
    out = []
    for i, m in enumerate(messages):
        m = {k: v for k, v in m.items() if k != "reasoning_content"}
        if m.get("content") is None:
            m["content"] = ""
        if "tool_calls" in m:
            m["tool_calls"] = [
                {
                    **c,
                    "function": {
                        **c["function"],
                        "arguments": c["function"]["arguments"]
                        if args_as_string
                        else json.loads(c["function"]["arguments"]),
                    },
                }
                for c in m["tool_calls"]
            ]
        if i in turns and fates[turns.index(i)] == R and messages[i].get("reasoning_content"):
            m[reasoning_field] = messages[i]["reasoning_content"]
        out.append(m)
    return out


# -- Helpers -------------------------------------------------------------------------------------


def _args(call) -> dict:
    return json.loads(call["function"]["arguments"])


def _dumps(obj, **kw) -> str:
    """JSON as transformers' `tojson` filter writes it: non-ASCII kept, default separators."""
    return json.dumps(obj, ensure_ascii=False, **kw)


def _fate(reasoning, rendered: bool, unsupported: bool = False) -> str:
    if not reasoning:
        return NONE
    if rendered:
        return R
    return DROP_U if unsupported else DROP_T


# -- Qwen3 (hybrid) and Qwen3-Thinking-2507 --------------------------------------------------------

QWEN_TOOLS_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
QWEN_TOOLS_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
)


def expect_qwen3(messages, tools, mode, thinking_2507=False):
    """Qwen3: the tools in the system block (the user's system text first); tool results as user
    turns of '<tool_response>' blocks (consecutive results share one turn). An assistant turn after
    the last real user message is rendered with its think block when it is the last message or has
    reasoning; every other turn without one. Calls follow the content, after a newline only when
    the content is not empty.

    The generation prompt forces '<think>\\n' in 2507, '<think>\\n\\n</think>\\n\\n' in Qwen3 with
    enable_thinking false (nothing with it true): the part of it a turn's render repeats, up to
    the turn's own reasoning, is not masked."""
    forced = (
        "<think>\n"
        if thinking_2507
        else ("" if mode.get("enable_thinking", True) else "<think>\n\n</think>\n\n")
    )
    seg, fates = [], []
    system = messages[0]["content"] if messages[0]["role"] == "system" else None
    head = "<|im_start|>system\n" + (system + "\n\n" if system is not None else "")
    seg.append((head + QWEN_TOOLS_HEAD + "".join("\n" + _dumps(t) for t in tools) + QWEN_TOOLS_TAIL, 0))
    last_query = max(i for i, m in enumerate(messages) if m["role"] == "user")
    for i, m in enumerate(messages):
        role = m["role"]
        if role == "system":
            continue
        if role == "user":
            seg.append((f"<|im_start|>user\n{m['content']}<|im_end|>\n", 0))
        elif role == "tool":
            first = messages[i - 1]["role"] != "tool"
            last = i == len(messages) - 1 or messages[i + 1]["role"] != "tool"
            text = (
                "<|im_start|>user" if first else ""
            ) + f"\n<tool_response>\n{m['content']}\n</tool_response>"
            seg.append((text + ("<|im_end|>\n" if last else ""), 0))
        else:
            content = m["content"] or ""
            r = m.get("reasoning_content") or ""
            think = i > last_query and (i == len(messages) - 1 or r)
            body = content
            if think:
                body = f"<think>\n{r.strip(chr(10))}\n</think>\n\n{content.lstrip(chr(10))}"
            for k, c in enumerate(m.get("tool_calls") or []):
                sep = "\n" if k or content else ""
                body += f'{sep}<tool_call>\n{{"name": "{c["function"]["name"]}", "arguments": {_dumps(_args(c))}}}\n</tool_call>'
            body += "<|im_end|>"
            # The forced text the render repeats: all of an empty think block, else '<think>\n'.
            unforced = 0
            if think and forced:
                unforced = len(forced) if body.startswith(forced) else len("<think>\n")
            seg += [("<|im_start|>assistant\n" + body[:unforced], 0), (body[unforced:], 1), ("\n", 0)]
            fates.append(_fate(r, bool(think)))
    return seg, fates


# -- DeepSeek-V3.1 -------------------------------------------------------------------------------

DS_CALLS_BEGIN, DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL_BEGIN, DS_SEP, DS_CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
DS_OUT_BEGIN, DS_OUT_END = "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"


def expect_deepseek_v3_1(messages, tools, mode):
    """DeepSeek-V3.1: the system texts after the BOS, no tools declaration (the template ignores
    `tools`), no reasoning field. An assistant turn right after a user turn opens with
    '<｜Assistant｜></think>' in both modes; after a tool output it has no header at all. A call is
    'NAME<｜tool▁sep｜>ARGUMENTS' with the arguments string as given; tool outputs are wrapped one
    by one. The generation prompt after a user turn is '<｜Assistant｜></think>' (thinking false:
    the '</think>' is not the model's) or '<｜Assistant｜><think>' (thinking true: the render's
    '</think>' closes the model's own, dropped, reasoning and is masked)."""
    forced_close = not mode.get("thinking", False)
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    seg, fates = [(BOS_DS + system, 0)], []
    after_user = False
    for m in messages:
        role = m["role"]
        if role == "user":
            seg.append((f"<｜User｜>{m['content']}", 0))
        elif role == "tool":
            seg.append((f"{DS_OUT_BEGIN}{m['content']}{DS_OUT_END}", 0))
        elif role == "assistant":
            if after_user:
                seg += [("<｜Assistant｜>", 0), ("</think>", 0 if forced_close else 1)]
            body = m["content"] or ""
            if m.get("tool_calls"):
                body += DS_CALLS_BEGIN
                for c in m["tool_calls"]:
                    body += f"{DS_CALL_BEGIN}{c['function']['name']}{DS_SEP}{c['function']['arguments']}{DS_CALL_END}"
                body += DS_CALLS_END
            seg.append((body + EOS_DS, 1))
            fates.append(_fate(m.get("reasoning_content"), False, unsupported=True))
        if role != "system":  # a system message between does not end the user turn
            after_user = role == "user"
    return seg, fates


# -- Kimi-K2-Thinking -----------------------------------------------------------------------------


def expect_kimi_k2_thinking(messages, tools, mode):
    """Kimi-K2-Thinking: the tools as one JSON list in a 'tool_declare' system block, then the
    default system message when the first is not one. Messages up to the last assistant turn
    without tool calls are history: their assistant turns write an empty '<think></think>'; the
    turns after it (a loop in flight) write '<think>REASONING</think>'. Calls are
    '<|tool_call_begin|>ID<|tool_call_argument_begin|>ARGS<|tool_call_end|>' in a section after
    the content; a tool result is a system-role block named by the message's `name`, headed
    '## Return of ID'. The generation prompt is the role header only."""
    seg, fates = [(f"<|im_system|>tool_declare<|im_middle|>{_dumps(tools)}<|im_end|>", 0)], []
    if messages[0]["role"] != "system":
        seg.append(
            (
                "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>",
                0,
            )
        )
    finished = max(
        (i for i, m in enumerate(messages) if m["role"] == "assistant" and not m.get("tool_calls")),
        default=-1,
    )
    for i, m in enumerate(messages):
        name = m.get("name") or m["role"]
        content = m["content"] or ""
        if m["role"] == "assistant":
            r = m.get("reasoning_content") or ""
            body = f"<think>{'' if i <= finished else r}</think>{content}"
            if m.get("tool_calls"):
                body += "<|tool_calls_section_begin|>"
                for c in m["tool_calls"]:
                    body += f"<|tool_call_begin|>{c['id']}<|tool_call_argument_begin|>{_dumps(_args(c))}<|tool_call_end|>"
                body += "<|tool_calls_section_end|>"
            seg += [(f"<|im_assistant|>{name}<|im_middle|>", 0), (body + "<|im_end|>", 1)]
            fates.append(_fate(r, i > finished))
        elif m["role"] == "tool":
            seg.append(
                (f"<|im_system|>{name}<|im_middle|>## Return of {m['tool_call_id']}\n{content}<|im_end|>", 0)
            )
        else:
            tag = "im_user" if m["role"] == "user" else "im_system"
            seg.append((f"<|{tag}|>{name}<|im_middle|>{content}<|im_end|>", 0))
    return seg, fates


# -- gpt-oss (harmony) ----------------------------------------------------------------------------


def _gpt_oss_namespace(tools) -> str:
    out = "## functions\n\nnamespace functions {\n\n"
    for t in tools:
        f = t["function"]
        out += f"// {f['description']}\ntype {f['name']} = (_: {{\n"
        for p, spec in f["parameters"]["properties"].items():
            optional = "" if p in f["parameters"].get("required", []) else "?"
            out += f"// {spec['description']}\n{p}{optional}: {spec['type']},\n"
        out += "}) => any;\n\n"
    return out + "} // namespace functions"


def expect_gpt_oss(messages, tools, mode):
    """gpt-oss: the system block names the reasoning effort and the commentary channel for calls;
    the developer block holds the system text and the tools as a TypeScript namespace. A turn
    with calls renders its FIRST call only ('<|start|>assistant to=functions.NAME<|channel|>
    commentary json<|message|>ARGS<|call|>'), preceded by its reasoning (or, without reasoning, its
    content) on the analysis channel only while no later plain assistant turn exists. A tool result
    is JSON-quoted and attributed to the latest call's function, whatever its own name. The final
    turn keeps its reasoning and ends '<|return|>'; earlier plain turns end '<|end|>'. The
    generation prompt is '<|start|>assistant'."""
    today = datetime.date.today().strftime("%Y-%m-%d")
    effort = mode.get("reasoning_effort", "medium")
    seg = [
        (
            "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
            f"Knowledge cutoff: 2024-06\nCurrent date: {today}\n\nReasoning: {effort}\n\n"
            "# Valid channels: analysis, commentary, final. Channel must be included for every message.\n"
            "Calls to these tools must go to the commentary channel: 'functions'.<|end|>",
            0,
        )
    ]
    loop = messages
    developer = ""
    if messages[0]["role"] == "system":
        developer = f"# Instructions\n\n{messages[0]['content']}\n\n"
        loop = messages[1:]
    seg.append((f"<|start|>developer<|message|>{developer}# Tools\n\n{_gpt_oss_namespace(tools)}<|end|>", 0))
    fates, last_call = [], None
    for k, m in enumerate(loop):
        if m["role"] == "user":
            seg.append((f"<|start|>user<|message|>{m['content']}<|end|>", 0))
        elif m["role"] == "tool":
            seg.append(
                (
                    f"<|start|>functions.{last_call} to=assistant<|channel|>commentary<|message|>{_dumps(m['content'])}<|end|>",
                    0,
                )
            )
        else:
            r = m.get("reasoning_content") or ""
            content = m["content"] or ""
            if "tool_calls" in m:
                answered = any(n["role"] == "assistant" and "tool_calls" not in n for n in loop[k + 1 :])
                analysis = "" if answered else (r or content)
                body = (
                    f"<|channel|>analysis<|message|>{analysis}<|end|><|start|>assistant" if analysis else ""
                )
                c = m["tool_calls"][0]["function"]
                last_call = c["name"]
                body += f" to=functions.{last_call}<|channel|>commentary json<|message|>{_dumps(json.loads(c['arguments']))}<|call|>"
                fates.append(_fate(r, not answered))
            elif k == len(loop) - 1:
                body = f"<|channel|>analysis<|message|>{r}<|end|><|start|>assistant" if r else ""
                body += f"<|channel|>final<|message|>{content}<|return|>"
                fates.append(_fate(r, True))
            else:
                body = f"<|channel|>final<|message|>{content}<|end|>"
                last_call = None
                fates.append(_fate(r, False))
            seg += [("<|start|>assistant", 0), (body, 1)]
    return seg, fates


# -- Llama 3.3 ------------------------------------------------------------------------------------


def expect_llama3_3(messages, tools, mode):
    """Llama 3.3: 'Environment: ipython' in the system block; the tools (JSON, indent 4) in the
    first user message; a call is the whole assistant turn, '{"name": NAME, "parameters": ARGS}'
    (its content, if any, is not rendered); a tool result is an 'ipython' turn holding the result
    JSON-quoted (a string is `iterable` to the template); every message trimmed, closed by
    '<|eot_id|>'. No reasoning."""
    system = ""
    if messages[0]["role"] == "system":
        system, messages = messages[0]["content"].strip(), messages[1:]
    seg = [
        (
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
            f"Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n{system}<|eot_id|>",
            0,
        ),
        (
            "<|start_header_id|>user<|end_header_id|>\n\n"
            "Given the following functions, please respond with a JSON for a function call with its "
            "proper arguments that best answers the given prompt.\n\n"
            'Respond in the format {"name": function name, "parameters": dictionary of argument name '
            "and its value}.Do not use variables.\n\n"
            + "".join(_dumps(t, indent=4) + "\n\n" for t in tools)
            + messages[0]["content"].strip()
            + "<|eot_id|>",
            0,
        ),
    ]
    fates = []
    for m in messages[1:]:
        if m["role"] == "tool":
            seg.append(
                (f"<|start_header_id|>ipython<|end_header_id|>\n\n{_dumps(m['content'])}<|eot_id|>", 0)
            )
        elif m["role"] == "assistant":
            if "tool_calls" in m:
                (c,) = m["tool_calls"]
                body = f'{{"name": "{c["function"]["name"]}", "parameters": {_dumps(_args(c))}}}'
            else:
                body = m["content"].strip()
            seg += [("<|start_header_id|>assistant<|end_header_id|>\n\n", 0), (body + "<|eot_id|>", 1)]
            fates.append(_fate(m.get("reasoning_content"), False, unsupported=True))
        else:
            seg.append(
                (f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content'].strip()}<|eot_id|>", 0)
            )
    return seg, fates


# -- The families ---------------------------------------------------------------------------------


@dataclass
class ToolFamily:
    name: str
    template: str  # file in REAL
    special: list[str]
    expect: Callable  # (messages, tools, mode) -> (segments, fates)
    modes: dict[str, dict]  # mode name -> chat_template_kwargs
    conversations: dict[str, list[dict]]
    reasoning_field: str | None = None  # the field the template reads reasoning from
    passed_as: str | None = None  # what eaglenest should report as how it hands reasoning over
    args_as_string: bool = False  # the template takes tool-call arguments as strings
    think_tokens: bool = False
    bos: str | None = None
    eos: str | None = None

    @property
    def path(self) -> Path:
        return REAL / self.template


QWEN_TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
KIMI_TOOL_TOKENS = [
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
]
DS_TOOL_TOKENS = [DS_CALLS_BEGIN, DS_CALLS_END, DS_CALL_BEGIN, DS_SEP, DS_CALL_END, DS_OUT_BEGIN, DS_OUT_END]

TOOL_FAMILIES = [
    ToolFamily(
        "qwen3",
        "qwen3.jinja",
        CHATML + QWEN_TOOL_TOKENS,
        expect_qwen3,
        {"thinking": {"enable_thinking": True}, "no_thinking": {"enable_thinking": False}},
        CONVERSATIONS,
        "reasoning_content",
        "reasoning_content",
        think_tokens=True,
        eos="<|im_end|>",
    ),
    ToolFamily(
        "qwen3_thinking_2507",
        "qwen3_thinking_2507.jinja",
        CHATML + QWEN_TOOL_TOKENS,
        lambda m, t, mode: expect_qwen3(m, t, mode, thinking_2507=True),
        {"default": {}},
        CONVERSATIONS,
        "reasoning_content",
        "reasoning_content",
        think_tokens=True,
        eos="<|im_end|>",
    ),
    ToolFamily(
        "deepseek_v3_1",
        "deepseek_v3_1.jinja",
        DEEPSEEK + DS_TOOL_TOKENS,
        expect_deepseek_v3_1,
        {"thinking": {"thinking": True}, "no_thinking": {"thinking": False}},
        CONVERSATIONS,
        args_as_string=True,
        think_tokens=True,
        bos=BOS_DS,
        eos=EOS_DS,
    ),
    ToolFamily(
        "kimi_k2_thinking",
        "kimi_k2_thinking.jinja",
        KIMI + KIMI_TOOL_TOKENS,
        expect_kimi_k2_thinking,
        {"default": {}},
        KIMI_CONVERSATIONS,
        "reasoning_content",
        "reasoning_content",
        think_tokens=True,
        eos="<|im_end|>",
    ),
    ToolFamily(
        "gpt_oss",
        "gpt_oss.jinja",
        ["<|start|>", "<|message|>", "<|end|>", "<|channel|>", "<|return|>", "<|call|>", "<|constrain|>"],
        expect_gpt_oss,
        {"low": {"reasoning_effort": "low"}, "high": {"reasoning_effort": "high"}},
        CONVERSATIONS,
        "thinking",
        "thinking",
        eos="<|return|>",
    ),
    ToolFamily(
        "llama3_3",
        "llama3_3.jinja",
        [
            "<|begin_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
            "<|python_tag|>",
            "<|eom_id|>",
        ],
        expect_llama3_3,
        {"default": {}},
        SINGLE_CALL_CONVERSATIONS,
        bos="<|begin_of_text|>",
        eos="<|eot_id|>",
    ),
]

CASES = [(fam, conv, mode) for fam in TOOL_FAMILIES for conv in fam.conversations for mode in fam.modes]


def corpus() -> list[str]:
    """Text the test tokenizers are trained on: every message's text, reasoning and call, the
    tool schemas, and the markup the templates wrap calls in."""
    out = [json.dumps(TOOLS, ensure_ascii=False), json.dumps(TOOLS, ensure_ascii=False, indent=4)]
    for convs in (CONVERSATIONS, KIMI_CONVERSATIONS, SINGLE_CALL_CONVERSATIONS):
        for conv in convs.values():
            for m in conv:
                out += [m.get("content") or "", m.get("reasoning_content") or ""]
                for c in m.get("tool_calls") or []:
                    f = c["function"]
                    out += [
                        c["id"],
                        f'{{"name": "{f["name"]}", "arguments": {f["arguments"]}}}',
                        f'{{"name": "{f["name"]}", "parameters": {f["arguments"]}}}',
                        f" to=functions.{f['name']}<|channel|>commentary json<|message|>{f['arguments']}",
                    ]
                if m["role"] == "tool":
                    out += [json.dumps(m["content"], ensure_ascii=False), f"## Return of {m['tool_call_id']}"]
    return [t for t in out if t]
