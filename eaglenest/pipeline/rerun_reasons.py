"""Why Snakemake reruns a job, in words: its `reason` sentence split into categories.

Snakemake gives the reason as one sentence per job (the `reason` field of its job events); it
has no structured form, so this is the one place that reads it.
"""

from __future__ import annotations

import re

# Reasons, in the order they are named when a job has several.
MISSING, INCOMPLETE, STALE, CODE, PARAMS, INPUT_SET, RULE_CODE, SOFTWARE, FORCED, UPSTREAM, OTHER = (
    "missing output", "incomplete output", "stale input", "changed code", "changed params",
    "changed input set", "changed rule code", "changed software env", "forced",
    "upstream rerun", "other",
)  # fmt: skip
REASON_ORDER = (
    MISSING,
    INCOMPLETE,
    STALE,
    CODE,
    PARAMS,
    INPUT_SET,
    RULE_CODE,
    SOFTWARE,
    FORCED,
    UPSTREAM,
    OTHER,
)

_REASON_PREFIXES = (
    ("Missing output files", MISSING),
    ("Incomplete output files", INCOMPLETE),
    ("Updated input files", STALE),
    ("Input files updated by another job", UPSTREAM),
    ("Set of input files has changed", INPUT_SET),
    ("Code has changed", RULE_CODE),
    ("Params have changed", PARAMS),
    ("Software environment definition has changed", SOFTWARE),
    ("Forced execution", FORCED),
)
_SEGMENT_SPLIT = re.compile(
    r"; (?=" + "|".join(re.escape(p) for p, _ in _REASON_PREFIXES) + r"|Rules with|Output file|Job provides)"
)
_CODE_HASH = re.compile(r"'[0-9a-f]{16}'")


def classify_reason(reason: str) -> list[tuple[str, str]]:
    """Snakemake's `reason:` text as (category, detail) pairs, in REASON_ORDER."""
    out: list[tuple[str, str]] = []
    for segment in _SEGMENT_SPLIT.split(reason.strip()):
        if not segment:
            continue
        for prefix, category in _REASON_PREFIXES:
            if segment.startswith(prefix):
                detail = segment[len(prefix) :].lstrip(" :")
                if category == PARAMS:
                    out.extend(_classify_params(detail))
                else:
                    out.append((category, detail))
                break
        else:
            out.append((OTHER, segment))
    return sorted(out, key=lambda c: REASON_ORDER.index(c[0]))


def _classify_params(detail: str) -> list[tuple[str, str]]:
    """Split a params change into the code hash (changed code) and the rest (changed params).

    Snakemake records params as the set of their reprs; its reason says which were only before
    and which only now. Every rule's `code` param is a 16-hex-digit hash in quotes.
    """
    m = re.search(r"before: (.*?) now: (.*?)\s*$", detail)
    if not m:
        return [(PARAMS, detail)]
    before, now = m.group(1), m.group(2)
    out = []
    if set(_CODE_HASH.findall(before)) != set(_CODE_HASH.findall(now)):
        out.append(
            (
                CODE,
                "package code hash "
                + " -> ".join(",".join(_CODE_HASH.findall(s)) or "-" for s in (before, now)),
            )
        )

    def rest(s: str) -> str:
        s = _CODE_HASH.sub("", s).replace("<nothing exclusive>", "")
        return s.strip(" ,")

    if rest(before) or rest(now):
        out.append((PARAMS, f"before: {clip(rest(before)) or '-'}; now: {clip(rest(now)) or '-'}"))
    return out or [(PARAMS, detail)]


def clip(s: str, n: int = 120) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."


__all__ = ["REASON_ORDER", "classify_reason"]
