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


@dataclass(frozen=True)
class TurnPlace:
    message: int  # index of the assistant message in the conversation
    span: tuple[int, int] | None  # characters [start, end) the model emits; None: not located
    reasoning: str  # one of NO_REASONING, *REASONING_FATES


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
        # Longest first, so that a greedy scan takes "<|im_end|>" before a shorter token.
        self._added = sorted((t for t in tokenizer.get_added_vocab() if t), key=len, reverse=True)
        self.reasoning_channel = self._find_reasoning_channel()
        self._probe_header = self._find_probe_header()

    # -- rendering --------------------------------------------------------------------------

    def render(self, messages: list[dict], generation_prompt: bool = False) -> str:
        # Passed as a batch of one, so an empty history ([]) reaches the template as a list.
        return self.tokenizer.apply_chat_template(
            [messages], tokenize=False, add_generation_prompt=generation_prompt, **self.template_kwargs
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

    def place(self, messages: list[dict], generation_prompt: bool = False, only_last: bool = False):
        """Render `messages` and place their assistant turns.

        Returns ``(text, places)``: the render (with ``add_generation_prompt=generation_prompt``)
        and a TurnPlace per assistant turn (only the last one with `only_last`). Raises
        TemplateMismatch when the values cannot be aligned, and the template's own exception
        when it cannot render the conversation.
        """
        assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        with_reasoning = {i for i in assistant if messages[i].get("reasoning")}
        keep = set(with_reasoning) if self.reasoning_channel else set()
        nonce = secrets.token_hex(4)
        while any(nonce in (m.get("content") or "") or nonce in (m.get("reasoning") or "") for m in messages):
            nonce = secrets.token_hex(4)
        c_of = {i: f"{_SENTINEL}{nonce}C{i}" for i in assistant}
        r_of = {i: f"{_SENTINEL}{nonce}R{i}" for i in assistant}

        def build(sentinels: bool) -> list[dict]:
            out = []
            for i, m in enumerate(messages):
                if m["role"] != "assistant":
                    out.append({"role": m["role"], "content": m["content"]})
                    continue
                content = c_of[i] if sentinels else m["content"]
                reasoning = (r_of[i] if sentinels else m["reasoning"]) if i in keep else None
                out.append(self._assistant_message(content, reasoning, self.reasoning_channel))
            return out

        sentinel_text = self.render(build(True), generation_prompt)
        lost = {i for i in keep if r_of[i] not in sentinel_text}
        if lost:  # render those turns without reasoning: no half-cut remainder is left
            keep -= lost
            sentinel_text = self.render(build(True), generation_prompt)
        real = build(False)
        text = self.render(real, generation_prompt)
        values = {c_of[i]: messages[i]["content"] for i in assistant}
        values.update({r_of[i]: messages[i]["reasoning"] for i in keep})
        spans = align_values(sentinel_text, text, values)
        value_starts = sorted(s for s, _ in spans.values())

        last_message = len(messages) - 1 if not generation_prompt else None
        places = []
        for i in assistant[-1:] if only_last else assistant:
            if i not in with_reasoning:
                fate = NO_REASONING
            elif i in keep:
                fate = RENDERED
            elif self.reasoning_channel is None:
                fate = DROPPED_UNSUPPORTED
            else:
                fate = DROPPED_BY_TEMPLATE
            span = self._turn_span(
                i, real, text, spans, c_of, r_of, keep, value_starts, is_last=i == last_message, build=build
            )
            places.append(TurnPlace(i, span, fate))
        return text, places

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
                start = len(history) + matched
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


__all__ = [
    "DROPPED_BY_TEMPLATE",
    "DROPPED_UNSUPPORTED",
    "INLINE",
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
