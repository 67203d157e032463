"""The evaluation's plots: acceptance per draft position, per set and mode, and per request."""

from __future__ import annotations

from eaglenest.core.io import atomic_path
from eaglenest.data.chat_turns import KINDS

# The methods the per-set and per-request plots compare: the baselines and the trained draft.
SPECULATING = ("ngram", "suffix", "draft")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_per_position(results: dict, out_png, title: str = "Per-position acceptance") -> None:
    """Grouped bars: for each draft position 1..k, each entry of `results` (a method, or a
    sweep's variant) with a per_position_acceptance list."""
    plt = _pyplot()
    methods = [m for m in results if results[m].get("per_position_acceptance")]
    fig, ax = plt.subplots(figsize=(7, 4))
    # One group of bars per draft position 1..k, the methods side by side within it.
    width = 0.8 / max(len(methods), 1)
    positions = max((len(results[m]["per_position_acceptance"]) for m in methods), default=0)
    for j, m in enumerate(methods):
        acc = results[m]["per_position_acceptance"]
        offset = (j - (len(methods) - 1) / 2) * width
        bars = ax.bar([k + 1 + offset for k in range(len(acc))], acc, width, label=m)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.set_xticks(range(1, positions + 1))
    ax.set(
        xlabel="draft position (k-th proposed token)",
        ylabel="acceptance rate",
        ylim=(0, 1.3),  # room above the bars for the legend
        title=title,
    )
    ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    if methods:
        ax.legend(loc="upper center", ncol=min(3, len(methods)), fontsize="small")
    fig.tight_layout()
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)


def plot_requests(requests: list[dict], out_png, k: int) -> None:
    """The spread of tokens per target step across requests, per set and speculating method,
    and each request's against its prompt length, under the ceiling k + 1."""
    import pandas as pd

    plt = _pyplot()

    df = pd.DataFrame(requests)
    df = df[df["method"].isin([m for m in SPECULATING if m in set(df["method"])])]
    fig, (ax_box, ax_len) = plt.subplots(1, 2, figsize=(11, 4))
    groups = [(s, m) for s in dict.fromkeys(df["set"]) for m in dict.fromkeys(df["method"])]
    data = [df[(df["set"] == s) & (df["method"] == m)]["tokens_per_step"] for s, m in groups]
    if groups:
        ax_box.boxplot(data, showmeans=True)
        ax_box.set_xticks(range(1, len(groups) + 1), [f"{s}\n{m}" for s, m in groups], fontsize=8)
    ax_box.set(
        ylabel="tokens per target step (per request)", title="Across requests (line: median, triangle: mean)"
    )
    for m, marker in zip(SPECULATING, ("x", "+", "o"), strict=True):
        sub = df[df["method"] == m]
        if len(sub):
            ax_len.scatter(
                sub["prompt_tokens"], sub["tokens_per_step"], s=12, marker=marker, alpha=0.6, label=m
            )
    ax_len.set(xlabel="prompt tokens (context the turn was asked with)", ylabel="tokens per target step",
               title="Against context length")  # fmt: skip
    for ax in (ax_box, ax_len):
        ax.axhline(k + 1, color="grey", linestyle="--", linewidth=1, label=f"ceiling k + 1 = {k + 1}")
        ax.set_ylim(0.9, k + 1.3)
    if len(df):
        ax_len.legend(fontsize="small")
    fig.tight_layout()
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)


def _grouped_bars(ax, groups: list[str], values: dict[str, list], k: int) -> None:
    """Bars of tokens per target step, a group per label, a bar per method, under the ceiling."""
    width = 0.8 / max(len(values), 1)
    for j, (method, ys) in enumerate(values.items()):
        offset = (j - (len(values) - 1) / 2) * width
        bars = ax.bar([i + offset for i in range(len(groups))], [y or 0 for y in ys], width, label=method)
        ax.bar_label(bars, labels=[f"{y:.2f}" if y else "" for y in ys], fontsize=6)
    ax.set_xticks(range(len(groups)), groups, fontsize=7)
    ax.axhline(k + 1, color="grey", linestyle="--", linewidth=1, label=f"ceiling k + 1 = {k + 1}")
    ax.set_ylim(0, k + 1.6)  # room above the ceiling for the legend
    ax.legend(loc="upper center", ncol=4, fontsize="x-small")


def plot_sets(per_set: dict, out_png, k: int) -> None:
    """Tokens per target step of each speculating method: per evaluated set and mode (left),
    and per span of the answers (right, every set together where the spans could be placed)."""
    plt = _pyplot()
    methods = [m for m in SPECULATING if m in per_set]
    sets = list(per_set[methods[0]]) if methods else []
    cells = [
        (name, mode) for name in sets for mode in (per_set[methods[0]][name].get("per_mode") or {"all": None})
    ]

    def figure_of(method, name, mode):
        fig = per_set[method][name]
        return fig if mode == "all" else fig["per_mode"][mode]

    fig, (ax_sets, ax_spans) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [3, 1]})
    _grouped_bars(
        ax_sets,
        [name if mode == "all" else f"{name}\n{mode}" for name, mode in cells],
        {m: [figure_of(m, name, mode)["mean_acceptance_length"] for name, mode in cells] for m in methods},
        k,
    )
    ax_sets.set(ylabel="tokens per target step", title="Per set and mode")

    def span_value(method, kind):
        tokens = steps = 0
        for name in sets:
            counts = ((per_set[method][name].get("per_span") or {}).get("kinds") or {}).get(kind)
            if counts:
                tokens, steps = tokens + counts["tokens"], steps + counts["steps"]
        return tokens / steps if steps else None

    kinds = [kind for kind in KINDS if any(span_value(m, kind) for m in methods)]
    _grouped_bars(ax_spans, kinds, {m: [span_value(m, kind) for kind in kinds] for m in methods}, k)
    ax_spans.set(title="Per span (sets together)")
    fig.tight_layout()
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
