"""The evaluation's tables: one row per method (acceptance.csv), per method, set, mode, group and
span (benchmarks.csv), and per request (requests.csv)."""

from __future__ import annotations

from eaglenest.core.io import atomic_path
from eaglenest.data.benchmarks import target_steps
from eaglenest.data.chat_turns import KINDS
from eaglenest.data.modes import DEFAULT_MODE

ACCEPTANCE_COLUMNS = (
    "mean_acceptance_length",
    "mean_acceptance_length_per_draft",
    "acceptance_rate",
    "output_tokens_per_s",
    "lossless",
    "identical_fraction",
)


def _write_csv(rows: list[dict], out_csv) -> None:
    import pandas as pd

    with atomic_path(out_csv) as tmp:
        pd.DataFrame(rows).to_csv(tmp, index=False)


def write_table(results: dict, out_csv) -> None:
    """acceptance.csv: each method's held-out figures."""
    _write_csv(
        [{"method": m, **{c: r.get(c) for c in ACCEPTANCE_COLUMNS}} for m, r in results.items()], out_csv
    )


def _figure_row(figures: dict, **where) -> dict:
    row = {
        **where,
        "requests": figures["requests"],
        "mean_acceptance_length": figures["mean_acceptance_length"],
        "mean_acceptance_length_per_draft": figures["mean_acceptance_length_per_draft"],
        "acceptance_rate": figures["acceptance_rate"],
        "output_tokens_per_s": figures.get("output_tokens_per_s"),
        "lossless": figures.get("lossless"),
    }
    for i, a in enumerate(figures.get("per_position_acceptance") or []):
        row[f"acceptance_pos_{i + 1}"] = a
    return row


def _span_rows(figures: dict, **where) -> list[dict]:
    spans = (figures.get("per_span") or {}).get("kinds", {})
    return [
        {
            **where,
            "span": kind,
            "requests": figures["per_span"]["requests_attributed"],
            "mean_acceptance_length": spans[kind]["mean_acceptance_length"],
            "mean_acceptance_length_per_draft": spans[kind]["mean_acceptance_length_per_draft"],
            "acceptance_rate": spans[kind]["acceptance_rate"],
            "span_tokens": spans[kind]["tokens"],
        }
        for kind in KINDS
        if kind in spans
    ]


def _mode_rows(method: str, name: str, mode: str, figures: dict) -> list[dict]:
    """One mode's rows of a set (mode "all": the modes together): the whole, then each category
    and traffic class, then each span."""
    where = {"set": name, "mode": mode, "category": "all", "traffic": "all", "span": "all", "method": method}
    rows = [_figure_row(figures, **where)]
    for key in ("category", "traffic"):
        rows += [
            _figure_row(g, **{**where, key: value}) for value, g in figures.get(f"per_{key}", {}).items()
        ]
    rows += _span_rows(figures, **where)
    return rows


def write_set_table(per_set: dict, out_csv) -> None:
    """benchmarks.csv: one row per method, set, mode, category, traffic class and span, "all"
    where a row takes them together (a set's modes, where it has several, each get their own
    rows beside the set's)."""
    rows = []
    for method, sets in per_set.items():
        for name, fig in sets.items():
            rows += _mode_rows(method, name, "all", fig)
            for mode, figures in fig.get("per_mode", {}).items():
                rows += _mode_rows(method, name, mode, figures)
    _write_csv(rows, out_csv)


def request_rows(stored: list[dict]) -> list[dict]:
    """Each request's own figures (one turn of one prompt of one method in one mode), with its
    tokens per span where they could be attributed (eaglenest.evaluation.spans)."""
    rows = []
    for o in stored:
        spec = o.get("spec") or {}
        tokens = o["completion_tokens"]
        steps = target_steps(tokens, o.get("spec"))
        spans = o.get("spans") or {}
        rows.append(
            {
                "method": o["method"],
                "set": o["set"],
                "category": o["category"],
                "mode": o.get("mode", DEFAULT_MODE),
                "traffic": o.get("traffic", "chat"),
                "id": o["id"],
                "turn": o["turn"] + 1,
                "prompt_tokens": o["prompt_tokens"],
                "output_tokens": tokens,
                "accepted_tokens": spec.get("num_accepted_draft_tokens", 0),
                "draft_tokens": spec.get("num_draft_tokens", 0),
                "drafting_steps": spec.get("num_spec_steps", 0),
                "target_steps": steps,
                "tokens_per_step": tokens / steps,
                **_span_counts(spans),
            }
        )
    return rows


def _span_counts(spans: dict) -> dict:
    """A request's tokens and steps per span; empty where they could not be attributed."""
    counts = {}
    for kind in KINDS:
        for count in ("tokens", "steps"):
            counts[f"{kind}_{count}"] = spans.get(kind, {}).get(count, 0) if spans else None
    return counts


def write_requests(requests: list[dict], out_csv) -> None:
    _write_csv(requests, out_csv)
