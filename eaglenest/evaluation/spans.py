"""Acceptance inside one response's spans: its reasoning, its answer and its tool calls.

A draft predicts these very differently (a reasoning trace is free text; tool-call markup is
nearly fixed), so one figure per response hides where it wins. vLLM reports, per response and in
order, how many drafts each verify step accepted (`--per-request-spec-decode-metrics detailed`):
walking the served token ids with those counts places every step at the token it started from.
A step belongs to the span of that token (the context its drafts were proposed from), and a
span's figures are its steps' tokens over its steps.

Only where every decode step drafts (the drafts) does the list place every step. n-gram and
suffix decoding skip drafting where they find no match, and vLLM does not list those steps, so
their places are unknown (a stop cutting the last step can even make the counts add up while
the places are wrong): their responses are counted as not attributed, and their acceptance
counts only in the whole-response figures. So does a draft's response whose counts do not add
up.
"""

from __future__ import annotations

from eaglenest.data.chat_turns import KINDS

SPAN_COUNTS = ("tokens", "steps", "drafting_steps", "accepted_tokens", "draft_tokens")


def response_spans(kinds: list[str], spec: dict | None) -> dict | None:
    """One response's counts per span kind ({kind: {tokens, steps, drafting_steps,
    accepted_tokens, draft_tokens}}), from `kinds` (the kind of each served token, in order)
    and its per-step metrics, for a method that drafts at every decode step; None where the
    engine's list does not place every step."""
    accepted = (spec or {}).get("per_step_accepted")
    drafted = (spec or {}).get("per_step_drafted")
    n = len(kinds)
    if accepted is None or drafted is None or n == 0:
        return None
    produced = 1 + sum(a + 1 for a in accepted)
    # vLLM counts a step's accepted drafts before it cuts the output at a stop, so the last step
    # may claim tokens past the end; anything else that does not add up is steps left unlisted.
    cut = produced - n
    if cut < 0 or (cut > 0 and cut > accepted[-1]):
        return None
    tally = {kind: dict.fromkeys(SPAN_COUNTS, 0) for kind in dict.fromkeys(kinds)}
    # The prefill's step gives the first token and drafts nothing.
    tally[kinds[0]].update(tokens=1, steps=1)
    position = 1
    for step_accepted, step_drafted in zip(accepted, drafted, strict=True):
        if position >= n:
            break
        counts = tally[kinds[position]]
        made = min(step_accepted + 1, n - position)
        counts["tokens"] += made
        counts["steps"] += 1
        counts["drafting_steps"] += 1
        counts["accepted_tokens"] += step_accepted
        counts["draft_tokens"] += step_drafted
        position += made
    return tally


def span_figures(requests: list[dict]) -> dict | None:
    """The spans' figures over requests that carry `spans` (response_spans): per kind, tokens
    per target step, 1 + accepted drafts per drafting step, and the drafts' acceptance rate;
    with how many requests could be attributed. None where no request speculated."""
    speculated = [r for r in requests if r.get("spec")]
    if not speculated:
        return None
    attributed = [r["spans"] for r in speculated if r.get("spans")]
    per_kind = {}
    for kind in KINDS:
        counts = {c: sum(s[kind][c] for s in attributed if kind in s) for c in SPAN_COUNTS}
        if not counts["steps"]:
            continue
        per_kind[kind] = {
            **counts,
            "mean_acceptance_length": counts["tokens"] / counts["steps"],
            "mean_acceptance_length_per_draft": (
                1 + counts["accepted_tokens"] / counts["drafting_steps"] if counts["drafting_steps"] else 1.0
            ),
            "acceptance_rate": (
                counts["accepted_tokens"] / counts["draft_tokens"] if counts["draft_tokens"] else None
            ),
        }
    return {"requests": len(speculated), "requests_attributed": len(attributed), "kinds": per_kind}


class SpanLabeller:
    """Labels a served answer's tokens by kind with the target's tokenizer (the same rule
    tokenize's loss mask uses: eaglenest.data.tokenize.Renderers.completion_kinds)."""

    def __init__(self, tokenizer):
        # tokenize brings numpy; evaluation loads the tokenizer only once it runs.
        from eaglenest.data.tokenize import KIND_LABELS, Renderers

        self._renderers = Renderers(tokenizer)
        self._names = {label: kind for kind, label in KIND_LABELS.items()}

    def kinds(self, token_ids: list[int]) -> list[str]:
        labels = self._renderers.completion_kinds(list(token_ids), reasoning=True)
        return [self._names[int(label)] for label in labels]

    def annotate(self, outs: list[dict], drafts_every_step: bool) -> None:
        """Each output's `spans` (response_spans), where it speculated and carries token ids;
        None for a method that skips drafting (its steps cannot be placed)."""
        for o in outs:
            if o.get("spec") and o.get("token_ids"):
                o["spans"] = (
                    response_spans(self.kinds(o["token_ids"]), o["spec"]) if drafts_every_step else None
                )
