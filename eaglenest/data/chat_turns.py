"""Where each assistant turn lies in a chat template's render, and what became of its reasoning.

A draft learns what the loss mask says the target emits, so for every assistant turn the mask must
cover exactly the text the model writes for it: its reasoning as the template renders it, the
answer and the end-of-turn token, and nothing of the prompt. Real templates make that hard: they
render a past turn differently from the generation prompt (Qwen3-Thinking's prompt ends in
``<think>\\n`` but a past turn has none), drop the reasoning of some turns (Kimi-K2-Thinking writes
an empty ``<think></think>``, DeepSeek cuts everything up to ``</think>``), strip or trim the text,
and end a final turn with another token than a past one (gpt-oss: ``<|return|>`` against
``<|end|>``). So no turn is located by comparing rendered strings character by character, which
goes wrong when an answer happens to start like the prompt's tail (an answer starting with ``<``).

How a turn is located, for any template and without per-template code:

1. **Values by sentinels.** The conversation is rendered twice: with its real values and with
   every assistant content and reasoning replaced by a unique sentinel word. The sentinel render
   says where the template put each value, and which values it dropped. Walking both renders
   segment by segment (the template text between values is identical in both) gives each value's
   characters in the real render, allowing for the strip/trim a template applies to a value.
2. **Start: after the header.** The header is what the generation prompt adds after the history
   (``render(messages[:i], add_generation_prompt=True)`` minus ``render(messages[:i])``). The turn
   starts after as much of the header as the render repeats, and never after the turn's first
   value: a forced ``<think>\\n`` in the prompt is not the model's, but where the past turn lacks it
   the turn starts right after the role marker, whatever the answer's first characters are.
3. **End: the end-of-turn token.** What the template writes after the turn's content when the turn
   is the last message (``<|im_end|>``, ``<|eot_id|>``...), whitespace after it left out. Where a
   past turn closes with another token than a last one (gpt-oss), the same number of special
   tokens is taken.

Reasoning reaches the template the way it takes it: a message field (``reasoning_content``,
``thinking`` or ``reasoning``, whichever the template renders), else inline ``<think>`` text when
the tokenizer has those tokens and the template keeps them. A turn whose reasoning the template
does not render is rendered without it and counted (``dropped_by_template``), so no stray
remainder (an empty think block, a blank line) is left by a half-cut reasoning either.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass

REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
INLINE = "inline"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

# What became of an assistant turn's reasoning.
NO_REASONING = "none"
RENDERED = "rendered"
DROPPED_BY_TEMPLATE = "dropped_by_template"  # the template renders no reasoning at this turn
DROPPED_UNSUPPORTED = "dropped_unsupported"  # the template takes reasoning in no way we know
REASONING_FATES = (RENDERED, DROPPED_BY_TEMPLATE, DROPPED_UNSUPPORTED)

_SENTINEL = "EaglenestValue"


class TemplateMismatch(Exception):
    """The template renders this conversation's values in a way that cannot be aligned (it
    changes its text depending on what a value says, or repeats a value)."""


class OpensWithAssistant(TemplateMismatch):
    """The conversation opens with an assistant turn, and the template cannot render the
    generation prompt of a turn that has no user turn before it."""


# What a supervised token is: part of the reasoning, of the answer or of a tool call's markup.
KINDS = ("reasoning", "answer", "tool_call")


@dataclass(frozen=True)
class TurnPlace:
    message: int  # index of the assistant message in the conversation
    span: tuple[int, int] | None  # characters [start, end) the model emits; None: not located
    reasoning: str  # one of NO_REASONING, *REASONING_FATES
    answer_from: int | None = None  # where the answer starts (before it: the reasoning block)
    calls_from: int | None = None  # where the tool-call markup starts (None: no calls)

    def kind_spans(self) -> list[tuple[int, int, str]]:
        """The turn's characters by kind: ``(start, end, kind)`` of KINDS. An empty think block
        of a turn without reasoning counts as answer."""
        if self.span is None:
            return []
        start, end = self.span
        answer_from = start if self.answer_from is None else self.answer_from
        calls_from = end if self.calls_from is None else self.calls_from
        first_kind = "reasoning" if self.reasoning == RENDERED else "answer"
        parts = [
            (start, answer_from, first_kind),
            (answer_from, calls_from, "answer"),
            (calls_from, end, "tool_call"),
        ]
        return [p for p in parts if p[1] > p[0]]


def split_inline_reasoning(content: str) -> tuple[str | None, str]:
    """``(reasoning, answer)`` of a content that carries its reasoning inline: ``<think>R</think>A``,
    or ``R</think>A`` where the generation prompt opened the think block (DeepSeek-R1)."""
    if THINK_CLOSE not in content:
        return None, content
    before, after = content.split(THINK_CLOSE, 1)
    before = before.lstrip()
    if before.startswith(THINK_OPEN):
        before = before[len(THINK_OPEN) :]
    elif THINK_OPEN in before:  # text before an opening tag: not a reasoning block
        return None, content
    return before.strip("\n"), after.lstrip("\n")


def _common_prefix_len(a: str, b: str) -> int:
    # Binary search on slice equality: C-speed comparisons instead of a Python loop per char.
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _rendered_forms(value: str):
    """The forms a template may write a value in, most likely first (as is, stripped, trimmed)."""
    seen = set()
    for form in (
        value,
        value.strip(),
        value.strip("\n"),
        value.lstrip("\n"),
        value.rstrip("\n"),
        value.lstrip(),
        value.rstrip(),
    ):
        if form not in seen:
            seen.add(form)
            yield form


def align_values(sentinel_text: str, text: str, values: dict[str, str]) -> dict[str, tuple[int, int]]:
    """Character span in `text` of each value whose sentinel appears in `sentinel_text`.

    `sentinel_text` is the same render as `text` with each value replaced by its sentinel (a key of
    `values`). The template text between values must be identical in both; each value may have
    been written stripped or trimmed. Raises TemplateMismatch when the renders do not align.
    """
    found = []
    for sentinel in values:
        p = sentinel_text.find(sentinel)
        if p < 0:
            continue
        if sentinel_text.find(sentinel, p + 1) >= 0:
            raise TemplateMismatch("the template writes one value twice")
        found.append((p, sentinel))
    found.sort()
    spans: dict[str, tuple[int, int]] = {}
    at_s = at = 0  # positions in sentinel_text and text
    for k, (p, sentinel) in enumerate(found):
        before = sentinel_text[at_s:p]
        if not text.startswith(before, at):
            raise TemplateMismatch("the template text around the values differs with the values")
        at += len(before)
        after_end = found[k + 1][0] if k + 1 < len(found) else len(sentinel_text)
        after = sentinel_text[p + len(sentinel) : after_end]
        last = k + 1 == len(found)
        for form in _rendered_forms(values[sentinel]):
            rest = at + len(form)
            if text.startswith(form, at) and (text[rest:] == after if last else text.startswith(after, rest)):
                break
        else:
            raise TemplateMismatch("the template rewrites a value beyond stripping it")
        spans[sentinel] = (at, at + len(form))
        at, at_s = at + len(form), p + len(sentinel)
    if text[at:] != sentinel_text[at_s:]:
        raise TemplateMismatch("the template text after the values differs with the values")
    return spans


class ChatTurns:
    """Renders conversations with a tokenizer's chat template and places their assistant turns.

    Conversations are lists of ``{"role", "content", "reasoning"}`` (reasoning: str or None).
    """

    def __init__(self, tokenizer, template_kwargs: dict | None = None):
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        self._tools = None  # the tool declarations of the conversation being placed
        self._arguments_as_objects = True  # as vLLM's server hands them to the template
        # Longest first, so that a greedy scan takes "<|im_end|>" before a shorter token.
        self._added = sorted((t for t in tokenizer.get_added_vocab() if t), key=len, reverse=True)
        self.reasoning_channel = self._find_reasoning_channel()
        self._probe_header = self._find_probe_header()

    # -- rendering --------------------------------------------------------------------------

    def render(self, messages: list[dict], generation_prompt: bool = False) -> str:
        """The conversation as the target's server renders it: through the tokenizer (a
        remote-code tokenizer may render tools in Python, as Kimi-K2.5's does), with the
        conversation's tools, and with tool-call arguments as objects, as vLLM's server passes
        them; strings for a template that only takes strings (DeepSeek-V3.1 concatenates them)."""
        kwargs = dict(self.template_kwargs)
        if self._tools:
            kwargs["tools"] = self._tools
        calls = any(m.get("tool_calls") for m in messages)
        if calls and self._arguments_as_objects:
            try:
                return self._render(_arguments_as_objects(messages), generation_prompt, kwargs)
            except Exception:
                self._arguments_as_objects = False
        return self._render(messages, generation_prompt, kwargs)

    def _render(self, messages: list[dict], generation_prompt: bool, kwargs: dict) -> str:
        # Passed as a batch of one, so an empty history ([]) reaches the template as a list.
        return self.tokenizer.apply_chat_template(
            [messages], tokenize=False, add_generation_prompt=generation_prompt, **kwargs
        )[0]

    def _assistant_message(self, content: str, reasoning: str | None, channel: str | None) -> dict:
        if reasoning is None or channel is None:
            return {"role": "assistant", "content": content}
        if channel == INLINE:
            # As a DeepSeek-R1-style model writes it.
            inline = f"{THINK_OPEN}\n{reasoning.strip(chr(10))}\n{THINK_CLOSE}\n\n{content}"
            return {"role": "assistant", "content": inline}
        return {"role": "assistant", "content": content, channel: reasoning}

    def _find_reasoning_channel(self) -> str | None:
        """How this template takes reasoning: a message field that renders a final turn's
        reasoning; else a field the template names (it may render it only at some turns, as
        Kimi-K2-Thinking does for tool-calling turns); else inline <think> text, when the
        tokenizer has those tokens and the template keeps them; else None."""
        user = {"role": "user", "content": "Hello"}
        r, c = f"{_SENTINEL}Reasoning", f"{_SENTINEL}Answer"

        def renders(channel: str) -> bool:
            try:
                text = self.render([user, self._assistant_message(c, r, channel)])
            except Exception:
                return False
            return r in text and c in text

        for field in REASONING_FIELDS:
            if renders(field):
                return field
        template = self.tokenizer.get_chat_template()
        for field in REASONING_FIELDS:
            # A message attribute (message.thinking, message['thinking'], 'thinking' in message,
            # message.get('thinking')), not a template switch of the same name (DeepSeek-V3.1).
            f = re.escape(field)
            if re.search(
                rf"""message\s*(\.\s*{f}\b|\[\s*['"]{f}['"]|\.\s*get\(\s*['"]{f}['"])"""
                rf"""|['"]{f}['"]\s+in\s+message\b""",
                template,
            ):
                return field
        vocab = self.tokenizer.get_vocab()
        if THINK_OPEN in vocab and THINK_CLOSE in vocab and renders(INLINE):
            return INLINE
        return None

    # -- placing turns ------------------------------------------------------------------------

    def place(
        self, messages: list[dict], generation_prompt: bool = False, only_last: bool = False, tools=None
    ):
        """Render `messages` (declaring `tools`) and place their assistant turns.

        Returns ``(text, places)``: the render (with ``add_generation_prompt=generation_prompt``)
        and a TurnPlace per assistant turn (only the last one with `only_last`). Raises
        TemplateMismatch when the values cannot be aligned, and the template's own exception
        when it cannot render the conversation.
        """
        self._tools = tools
        try:
            return self._place(messages, generation_prompt, only_last)
        finally:
            self._tools = None

    def _place(self, messages: list[dict], generation_prompt: bool, only_last: bool):
        assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        with_reasoning = {i for i in assistant if messages[i].get("reasoning")}
        keep = set(with_reasoning) if self.reasoning_channel else set()
        # A calling turn whose answer is empty or not rendered is anchored on its first call's
        # name instead: a sentinel answer would change the render (Qwen3 writes a newline before
        # the calls only after text; gpt-oss refuses text beside reasoning; Llama drops it).
        empty_calls = {i for i in assistant if messages[i].get("tool_calls") and not messages[i]["content"]}
        try:
            return self._place_anchored(messages, generation_prompt, only_last, keep, set())
        except Exception:
            if not empty_calls:
                raise
        return self._place_anchored(messages, generation_prompt, only_last, keep, empty_calls)

    def _place_anchored(self, messages, generation_prompt: bool, only_last: bool, keep: set, by_name: set):
        """`place`, with the turns of `by_name` anchored on their first call's name."""
        assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        with_reasoning = {i for i in assistant if messages[i].get("reasoning")}
        keep = set(keep)
        nonce = secrets.token_hex(4)
        while any(nonce in (m.get("content") or "") or nonce in (m.get("reasoning") or "") for m in messages):
            nonce = secrets.token_hex(4)
        c_of = {i: f"{_SENTINEL}{nonce}C{i}" for i in assistant}
        r_of = {i: f"{_SENTINEL}{nonce}R{i}" for i in assistant}

        def build(sentinels: bool) -> list[dict]:
            out = []
            for i, m in enumerate(messages):
                if m["role"] != "assistant":
                    out.append({k: m[k] for k in ("role", "content", "tool_call_id", "name") if k in m})
                    continue
                content = c_of[i] if sentinels and i not in by_name else m["content"]
                reasoning = (r_of[i] if sentinels else m["reasoning"]) if i in keep else None
                message = self._assistant_message(content, reasoning, self.reasoning_channel)
                if m.get("tool_calls"):
                    calls = m["tool_calls"]
                    if sentinels and i in by_name:
                        first = calls[0]
                        calls = [{**first, "function": {**first["function"], "name": c_of[i]}}, *calls[1:]]
                    message["tool_calls"] = calls
                out.append(message)
            return out

        sentinel_text = self.render(build(True), generation_prompt)
        unrendered = {i for i in assistant if messages[i].get("tool_calls") and c_of[i] not in sentinel_text}
        if unrendered - by_name:
            by_name |= unrendered
            sentinel_text = self.render(build(True), generation_prompt)
        lost = {i for i in keep if r_of[i] not in sentinel_text}
        if lost:  # render those turns without reasoning: no half-cut remainder is left
            keep -= lost
            sentinel_text = self.render(build(True), generation_prompt)
        real = build(False)
        text = self.render(real, generation_prompt)
        values = {
            c_of[i]: messages[i]["tool_calls"][0]["function"]["name"]
            if i in by_name
            else messages[i]["content"]
            for i in assistant
        }
        values.update({r_of[i]: messages[i]["reasoning"] for i in keep})
        spans = align_values(sentinel_text, text, values)
        value_starts = sorted(s for s, _ in spans.values())

        last_message = len(messages) - 1 if not generation_prompt else None
        places = []
        for i in assistant[-1:] if only_last else assistant:
            span = self._turn_span(
                i, real, text, spans, c_of, r_of, keep, value_starts, is_last=i == last_message, build=build
            )
            if span is None:
                answer_from = calls_from = None
            elif i in by_name:  # all of it after the reasoning is the calls' markup
                answer_from = calls_from = spans[r_of[i]][1] if i in keep else span[0]
            else:
                answer_from = spans[c_of[i]][0]
                calls_from = spans[c_of[i]][1] if messages[i].get("tool_calls") else None
            places.append(TurnPlace(i, span, self._fate(i, with_reasoning, keep), answer_from, calls_from))
        return text, places

    def _fate(self, i: int, with_reasoning: set, keep: set) -> str:
        """What became of turn i's reasoning."""
        if i not in with_reasoning:
            return NO_REASONING
        if i in keep:
            return RENDERED
        return DROPPED_UNSUPPORTED if self.reasoning_channel is None else DROPPED_BY_TEMPLATE

    def _turn_span(self, i, real, text, spans, c_of, r_of, keep, value_starts, is_last, build):
        content = spans.get(c_of[i])
        if content is None:  # the template wrote no answer for this turn
            return None
        first = min(content[0], spans[r_of[i]][0]) if i in keep else content[0]
        # Start: after the header, as far as the render repeats it, never past the first value.
        try:
            history = self.render(real[:i])
            prompt = self.render(real[:i], generation_prompt=True)
            header = prompt[len(history) :] if prompt.startswith(history) else None
        except Exception:  # e.g. a template that cannot render an empty history
            history = header = None
        header = self._probe_header if header is None else header
        if header is None:
            if all(m["role"] == "system" for m in real[:i]):
                raise OpensWithAssistant(
                    "the conversation opens with an assistant turn, and the chat template "
                    "renders no generation prompt to tell where such a turn starts"
                )
            return None
        start = None
        if history is not None and text.startswith(history) and len(history) <= first:
            matched = _common_prefix_len(header, text[len(history) : first])
            if matched >= len(self._role_marker(header)):  # not a mere "<|im_" of another token
                # Never inside a token the render writes: DeepSeek-V3.1's thinking prompt ends
                # "<think>" where a past turn has "</think>", which shares only its "<".
                start = self._token_start(text, len(history) + matched)
        if start is None:  # the render differs from the history render: find the header
            previous = max((e for _, e in spans.values() if e <= first), default=0)
            start = self._find_header(text, header, previous, first)
        if start is None:
            return None
        # End: the end-of-turn token(s), without the whitespace after them.
        c_end = content[1]
        if is_last:
            end = c_end + len(text[c_end:].rstrip())
        else:
            alone = self.render(build(True)[: i + 1])
            closing = alone[alone.find(c_of[i]) + len(c_of[i]) :].rstrip()
            if text.startswith(closing, c_end):
                end = c_end + len(closing)
            else:  # closed by other special tokens than when last (gpt-oss: <|end|>, <|return|>)
                end = self._skip_special(text, c_end, self._count_special(closing))
        own = {content[0], spans[r_of[i]][0] if i in keep else -1}
        bound = next((s for s in value_starts if s >= c_end and s not in own), len(text))
        if end is None or end > bound or end <= start:
            return None
        return start, end

    def _find_probe_header(self) -> str | None:
        """The header after a one-message history, for turns whose own history cannot render."""
        user = [{"role": "user", "content": "Hello"}]
        try:
            history, prompt = self.render(user), self.render(user, generation_prompt=True)
        except Exception:
            return None
        return prompt[len(history) :] if prompt.startswith(history) and len(prompt) > len(history) else None

    def _role_marker(self, header: str) -> str:
        """The least of a header a turn must repeat: its first special token, or all of it."""
        return next((t for t in self._added if header.startswith(t)), header)

    def _find_header(self, text: str, header: str, lo: int, hi: int) -> int | None:
        """Where the turn starts when its history renders differently: after the last occurrence
        in ``text[lo:hi]`` of the header, or of its longest beginning that still holds the
        header's first special token (the role marker)."""
        for m in range(len(header), len(self._role_marker(header)) - 1, -1):
            q = text.rfind(header[:m], lo, hi)
            if q >= 0:
                return q + m
        return None

    def _token_start(self, text: str, at: int) -> int:
        """`at`, or the start of the added token in `text` that `at` falls inside."""
        for token in self._added:
            for p in range(max(at - len(token) + 1, 0), at):
                if text.startswith(token, p):
                    return p
        return at

    def _count_special(self, text: str) -> int:
        """How many added tokens `text` consists of (0 when it holds anything else)."""
        n = at = 0
        while at < len(text):
            token = next((t for t in self._added if text.startswith(t, at)), None)
            if token is None:
                return 0
            at, n = at + len(token), n + 1
        return n

    def _skip_special(self, text: str, at: int, n: int) -> int | None:
        """The position after `n` added tokens from `at` (None unless they are there)."""
        if n == 0:
            return None
        for _ in range(n):
            token = next((t for t in self._added if text.startswith(t, at)), None)
            if token is None:
                return None
            at += len(token)
        return at


def _arguments_as_objects(messages: list[dict]) -> list[dict]:
    """The messages with each tool call's arguments parsed from their JSON string, as vLLM's
    server does before rendering (arguments that are not a JSON object become ``{}`` there too)."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = []
            for call in m["tool_calls"]:
                arguments = call["function"].get("arguments")
                if isinstance(arguments, str):
                    try:
                        arguments = json.loads(arguments) if arguments.strip() else {}
                    except json.JSONDecodeError:
                        arguments = {}
                    arguments = arguments if isinstance(arguments, dict) else {}
                calls.append({**call, "function": {**call["function"], "arguments": arguments}})
            m = {**m, "tool_calls": calls}
        out.append(m)
    return out


__all__ = [
    "DROPPED_BY_TEMPLATE",
    "DROPPED_UNSUPPORTED",
    "INLINE",
    "KINDS",
    "NO_REASONING",
    "REASONING_FATES",
    "REASONING_FIELDS",
    "RENDERED",
    "ChatTurns",
    "OpensWithAssistant",
    "TemplateMismatch",
    "TurnPlace",
    "align_values",
    "split_inline_reasoning",
]
