"""The figures of one evaluated set: acceptance overall and per group, losslessness, and the
noise floor a draft's losslessness is judged against where the engine is not bit-reproducible.

Acceptance itself (tokens per target step, vLLM's per-draft figure, per position) is
eaglenest.data.benchmarks.request_acceptance, from each response's own spec-decode metrics; the
spans' figures are eaglenest.evaluation.spans.
"""

from __future__ import annotations

from eaglenest.data.benchmarks import HELD_OUT, request_acceptance
from eaglenest.data.modes import DEFAULT_MODE
from eaglenest.evaluation.spans import span_figures

# The groups a set's figures are also given per, where a set (or one of its modes) has more
# than one of them. Modes come first: each mode's figures have these groups of their own.
GROUPS = ("category", "turn", "traffic")


def answer_key(o: dict) -> tuple:
    """Where an output's reference answer is kept: (set, mode, id, turn)."""
    return (o.get("set", HELD_OUT), o.get("mode") or DEFAULT_MODE, o["id"], o.get("turn", 0))


def lossless(reference: list[dict], outs: list[dict]) -> tuple[bool, list[str]]:
    """Greedy speculation must reproduce the outputs without it, token for token."""
    differ = [
        o["id"]
        for r, o in zip(reference, outs, strict=True)
        if (r["token_ids"], r["text"]) != (o["token_ids"], o["text"])
    ]
    return not differ, differ


def lossless_fields(outs: list[dict], answers: dict) -> dict:
    """Whether these outputs equal no speculation's (`answers`, by answer_key), token for token."""
    same, differ = lossless([answers[answer_key(o)] for o in outs], outs)
    return {
        "lossless": same,
        "identical_fraction": 1 - len(differ) / len(outs),
        "prompts_differing": differ,
    }


def group_figures(outs: list[dict], seconds: float | None, answers: dict, k: int) -> dict:
    """One method on one group of requests: acceptance, its spans, output tokens/s (where the
    group was asked on its own, so that its seconds are known), and losslessness."""
    figures = request_acceptance(outs, k)
    if seconds is not None:
        figures["seconds"] = round(seconds, 3)
        figures["output_tokens_per_s"] = round(figures["output_tokens"] / seconds, 2) if seconds else None
    figures.update(lossless_fields(outs, answers))
    spans = span_figures(outs)
    if spans:
        figures["per_span"] = spans
    return figures


def _with_groups(figures: dict, outs: list[dict], answers: dict, k: int) -> dict:
    for key in GROUPS:
        groups = dict.fromkeys(o[key] for o in outs)
        if len(groups) > 1:
            figures[f"per_{key}"] = {
                str(g): group_figures([o for o in outs if o[key] == g], None, answers, k) for g in groups
            }
    return figures


def set_figures(
    outs: list[dict], seconds_by_mode: dict[str, float], too_long: list[str], answers: dict, k: int
) -> dict:
    """One method on one evaluated set, its modes together, then per mode (each asked on its
    own, `seconds_by_mode`), and within each per category, turn and traffic class."""
    figures = _with_groups(group_figures(outs, sum(seconds_by_mode.values()), answers, k), outs, answers, k)
    figures["conversations_cut_too_long"] = too_long
    modes = dict.fromkeys(o["mode"] for o in outs)
    if len(modes) > 1:
        figures["per_mode"] = {
            m: _with_groups(
                group_figures(sub := [o for o in outs if o["mode"] == m], seconds_by_mode.get(m), answers, k),
                sub,
                answers,
                k,
            )
            for m in modes
        }
    return figures


def noise_floor_margin(floor: float, prompts: int) -> float:
    """How far under n-gram's identical fraction a lossless draft may land by chance: two
    binomial standard errors and one prompt."""
    return 2 * (floor * (1 - floor) / prompts) ** 0.5 + 1 / prompts


def judge_against_noise_floor(results: dict, floor: float, prompts: int) -> None:
    """Across tensor-parallel ranks a correct draft's greedy outputs can differ from no
    speculation's: verification runs other batch shapes, and vLLM's reductions are not
    bit-reproducible. n-gram drafting is always right or wrong by table lookup, so what
    differs under it is the engine's own noise: its identical fraction is the floor. A draft
    is lossless when its identical fraction is within two binomial standard errors (and one
    prompt) of that floor; far below it is a speculation bug. The strict figure is kept."""
    margin = noise_floor_margin(floor, prompts)
    for method, r in results.items():
        if method in ("no_spec", "ngram"):
            continue
        r["lossless_bit_exact"] = r["lossless"]
        r["lossless"] = r["identical_fraction"] >= floor - margin
        r["noise_floor"] = {"ngram_identical_fraction": floor, "margin": round(margin, 4)}


def ngram_identical_fraction(rows: list[dict], answers: dict, set_name: str = HELD_OUT) -> float | None:
    """n-gram's share of a set's outputs equal to no speculation's (the noise floor)."""
    ngram = [r for r in rows if r["method"] == "ngram" and r.get("set", HELD_OUT) == set_name]
    if not ngram:
        return None
    _, differ = lossless([answers[answer_key(r)] for r in ngram], ngram)
    return 1 - len(differ) / len(ngram)


def lossless_meaning(tp: int, noise_floor: float | None) -> str:
    """What `lossless` proves on this server: bit-identical greedy outputs where the engine is
    reproducible; against n-gram's identical fraction (`noise_floor`) where it is not."""
    if noise_floor is None:
        return (
            "greedy outputs of each method compared token for token with no speculation; "
            "n-gram's were identical, so any difference is a speculation bug"
        )
    return (
        f"greedy outputs compared token for token with no speculation: even n-gram's differ on "
        f"{1 - noise_floor:.0%} of the held-out prompts (tensor parallel {tp}; 16-bit kernels "
        "verify in other batch shapes than they decode), so a draft is judged against that "
        "noise floor (`noise_floor`; the strict comparison is `lossless_bit_exact`)"
    )
