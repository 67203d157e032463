"""The sweep's report: each variant's acceptance, validation estimate and training time side by
side, and the data-scaling fit (the compare_variants rule). The variants themselves are
eaglenest.training.sweep's."""

from __future__ import annotations

import logging
import math

from eaglenest.core.errors import EaglenestError
from eaglenest.core.io import atomic_path, read_json, write_json
from eaglenest.evaluation.plots import plot_per_position
from eaglenest.report.summary import read_benchmark
from eaglenest.training.sweep import LOG_AXES, SETTINGS, format_setting

log = logging.getLogger(__name__)


def validation_estimate(metrics: dict, k: int) -> dict:
    """The trainer's own estimate of served acceptance, from speculators' last-epoch validation
    accuracies: the chance that the first p drafted tokens are all accepted is the product of
    its conditional accuracies (`cond_acc_i`: step i right, given steps before it right) up to
    p, and tokens per draft is 1 plus their sum. Positions past the draft's ttt_steps have no
    estimate, and then neither has the total. speculators scores the draft against the target's
    best token within the draft vocabulary (its verifier head keeps the t2d rows only), so a
    token outside it never counts as a miss: the smaller the vocabulary's coverage, the more
    the estimate exceeds what vLLM measures. A P-EAGLE draft records no conditional accuracy
    (each depth of its one pass is scored on its own), so it has no estimate."""
    epochs = metrics.get("per_epoch") or []
    val = epochs[-1].get("val", {}) if epochs else {}
    per_position: list[float] = []
    chance = 1.0
    for p in range(k):
        acc = val.get(f"cond_acc_{p}_epoch")
        if acc is None:
            break
        chance *= acc
        per_position.append(chance)
    total = 1 + sum(per_position) if per_position and len(per_position) == k else None
    return {"per_position": per_position, "tokens_per_draft": total}


def fit_data_scaling(rows: list[int], tokens: list[float], ceiling: float) -> dict | None:
    """Least squares of tokens per step against log2(training rows), and two estimates of what
    doubling the data would add, both extrapolations past the largest measured size, capped at
    `ceiling` (k + 1, every draft accepted): the fit's slope, and the slope between the two
    largest sizes. Acceptance flattens as data grows, so where they differ the curve is bending
    and the second is the closer guess. None with fewer than two distinct sizes."""
    points = sorted(zip(rows, tokens, strict=True))
    if len({r for r, _ in points}) < 2:
        return None
    xs = [math.log2(r) for r, _ in points]
    ys = [t for _, t in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    intercept = my - slope * mx
    largest = points[-1][0]
    at_largest = intercept + slope * math.log2(largest)
    at_double = min(ceiling, intercept + slope * math.log2(2 * largest))
    residual = max(abs(y - (intercept + slope * x)) for x, y in zip(xs, ys, strict=True))
    # The two largest distinct sizes (the mean where a size was measured more than once).
    sizes = sorted({r for r, _ in points})[-2:]
    mean = [sum(t for r, t in points if r == size) / sum(1 for r, _ in points if r == size) for size in sizes]
    last_slope = (mean[1] - mean[0]) / math.log2(sizes[1] / sizes[0])
    return {
        "form": "tokens_per_step = intercept + per_doubling * log2(train_rows)",
        "intercept": intercept,
        "per_doubling": slope,
        "points": len(points),
        "max_abs_residual": residual,
        "largest_rows": largest,
        "fitted_at_largest": at_largest,
        "doubled_rows": 2 * largest,
        "estimate_at_doubled": at_double,
        "estimated_gain_from_doubling": at_double - at_largest,
        "last_step_rows": sizes,
        "last_step_per_doubling": last_slope,
        "last_step_estimate_at_doubled": min(ceiling, mean[1] + last_slope),
        "last_step_estimated_gain_from_doubling": min(ceiling, mean[1] + last_slope) - mean[1],
    }


def served_columns(acceptance: dict, k: int, prefix: str = "") -> dict:
    """A draft's served figures on one prompt set: tokens per target step, per-position
    acceptance (the share of drafts whose first p tokens were accepted), output tokens/s and
    losslessness; a benchmark's (MT-Bench, a local set) carry its name as `prefix`."""
    served = acceptance.get("per_position_acceptance") or []
    columns = {f"{prefix}tokens_per_step": acceptance["mean_acceptance_length"]}
    for p in range(k):
        columns[f"{prefix}accept_pos_{p + 1}"] = served[p] if p < len(served) else None
    columns[f"{prefix}output_tokens_per_s"] = acceptance.get("output_tokens_per_s")
    columns[f"{prefix}lossless"] = acceptance.get("lossless")
    return columns


def benchmark_names(rows: list[dict]) -> list[str]:
    """The benchmarks the comparison rows hold columns of, in the order they first appear."""
    suffix = "_tokens_per_step"
    names = [c[: -len(suffix)] for r in rows for c in r if c.endswith(suffix) and c != "tokens_per_step"]
    return list(dict.fromkeys(names))


def comparison_rows(variants: list[dict], keys: list[str], k: int, no_spec_tokens_per_s) -> list[dict]:
    """One row per variant: its settings, vocabulary coverage, served acceptance on the
    held-out prompts beside the trainer's estimate of it, throughput and training time, then
    its served figures on each benchmark. `variants`: dicts with name, is_base, settings and
    the read files acceptance (the draft's entry), metrics, coverage, train_s; optionally
    benchmarks (name: the draft's entry there)."""
    rows = []
    for v in variants:
        acc, metrics = v["acceptance"], v["metrics"]
        estimate = validation_estimate(metrics, k)
        row = {
            "variant": v["name"],
            "base": v["is_base"],
            **{key: v["settings"][key] for key in SETTINGS},
            "train_rows": metrics.get("train_rows"),
            "vocab_coverage": v["coverage"]["coverage"],
            **served_columns(acc, k),
            "tokens_per_draft": acc.get("mean_acceptance_length_per_draft"),
            "val_estimate_tokens_per_draft": estimate["tokens_per_draft"],
            **{
                f"val_estimate_pos_{p + 1}": estimate["per_position"][p]
                if p < len(estimate["per_position"])
                else None
                for p in range(k)
            },
            "acceptance_rate": acc.get("acceptance_rate"),
        }
        tps = acc.get("output_tokens_per_s")
        row["speedup_vs_no_spec"] = tps / no_spec_tokens_per_s if tps and no_spec_tokens_per_s else None
        for bench, served_there in (v.get("benchmarks") or {}).items():
            row.update(served_columns(served_there, k, prefix=f"{bench}_"))
        row["train_s"] = v.get("train_s")
        row["swept"] = ",".join(keys)
        rows.append(row)
    return rows


def _lines(rows: list[dict], key: str, keys: list[str]) -> list[tuple[str, list[dict]]]:
    """The variants along `key`: one line per combination of the other swept settings, those
    with two or more points, each sorted by `key`; labelled by the settings it holds fixed."""
    others = [o for o in keys if o != key]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r[o] for o in others), []).append(r)
    out = []
    for fixed, members in groups.items():
        if len({m[key] for m in members}) >= 2:
            label = ", ".join(
                f"{SETTINGS[o][0]} {format_setting(v)}".strip() for o, v in zip(others, fixed, strict=True)
            )
            out.append((label or "all", sorted(members, key=lambda m: m[key])))
    return out


def _draw_setting(ax_acc, ax_tps, rows: list[dict], key: str, keys: list[str]) -> None:
    """One swept setting's column: each line of variants along `key`, acceptance above (held
    out, the trainer's estimate, each benchmark), output tokens/s below, and the ticks."""
    numeric = all(isinstance(r[key], int | float) for r in rows)
    # A setting named by words (algorithm) has no order: its values stand at evenly spaced
    # places in the order the variants come (the base first), as points, not joined by lines.
    values = sorted({r[key] for r in rows}) if numeric else list(dict.fromkeys(r[key] for r in rows))
    at = {v: v if numeric else i for i, v in enumerate(values)}
    solid, dashed, dash_dot = ("-", "--", "-.") if numeric else ("none", "none", "none")
    lines = _lines(rows, key, keys)
    for label, members in lines:
        xs = [at[m[key]] for m in members]
        (line,) = ax_acc.plot(
            xs,
            [m["tokens_per_step"] for m in members],
            marker="o",
            linestyle=solid,
            label=f"held out ({label})",
        )
        est = [m["val_estimate_tokens_per_draft"] for m in members]
        if any(e is not None for e in est):
            ax_acc.plot(
                xs,
                est,
                marker="x",
                linestyle=dashed,
                color=line.get_color(),
                label=f"trainer's estimate ({label})",
            )
        for bench, marker in zip(benchmark_names(rows), "s^vD", strict=False):
            tokens = [m.get(f"{bench}_tokens_per_step") for m in members]
            ax_acc.plot(
                xs,
                tokens,
                marker=marker,
                linestyle=dash_dot,
                color=line.get_color(),
                label=f"{bench} ({label})",
            )
        tps = [m["output_tokens_per_s"] for m in members]
        ax_tps.plot(xs, tps, marker="o", linestyle=solid, color=line.get_color(), label=label)
    if not lines:
        ax_acc.text(
            0.5, 0.5, "no two variants differ in this setting alone", ha="center", transform=ax_acc.transAxes
        )
    labels = [format_setting(x) for x in values]
    if key == "draft_vocab_size":  # coverage: the share of training tokens it holds
        coverage = {r[key]: r["vocab_coverage"] for r in rows}
        labels = [f"{x}\ncoverage {coverage[x]:.2f}" for x in values]
    for ax in (ax_acc, ax_tps):
        if key in LOG_AXES:
            ax.set_xscale("log", base=2)
        ax.set_xticks([at[x] for x in values], labels)
        ax.minorticks_off()


def plot_comparison(rows: list[dict], keys: list[str], no_spec_tokens_per_s, out_png) -> None:
    """One column per swept setting: served tokens per target step on the held-out prompts
    (solid), the trainer's estimate (dashed) and each benchmark (dash-dotted) above, output
    tokens/s below; the draft-vocabulary ticks carry the vocabulary's coverage."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = max(len(keys), 1)
    fig, axes = plt.subplots(2, cols, figsize=(4.5 * cols, 7), squeeze=False)
    for c, key in enumerate(keys):
        ax_acc, ax_tps = axes[0][c], axes[1][c]
        _draw_setting(ax_acc, ax_tps, rows, key, keys)
        if no_spec_tokens_per_s:
            ax_tps.axhline(no_spec_tokens_per_s, color="grey", linestyle=":", label="no speculation")
        ax_acc.set(title=f"Acceptance vs {key}", ylabel="tokens per target step", xlabel=key)
        ax_tps.set(title=f"Throughput vs {key}", ylabel="output tokens/s", xlabel=key)
        ax_acc.legend(fontsize="x-small")
        ax_tps.legend(fontsize="x-small")
    fig.tight_layout()
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)


def _draw_scaling_fit(ax, label: str, train_rows: list[int], fit: dict, k: int, color, box: int) -> None:
    """One line's log-linear fit over its measured sizes, dotted out to twice the data, the
    slope of its last two sizes dashed, and a box (the `box`-th, stacked from the bottom)
    saying these are estimates."""

    def at(r):
        return min(k + 1, fit["intercept"] + fit["per_doubling"] * math.log2(r))

    lo, hi = min(train_rows), fit["largest_rows"]
    ax.plot([lo, hi], [at(lo), at(hi)], "-", color=color, alpha=0.6, label=f"log-linear fit ({label})")
    ax.plot([hi, 2 * hi], [at(hi), at(2 * hi)], ":", color=color)
    last = fit["last_step_estimate_at_doubled"]
    ax.plot(
        [hi, 2 * hi],
        [last - fit["last_step_estimated_gain_from_doubling"], last],
        "--",
        color=color,
        label=f"slope of the last two sizes ({label})",
    )
    ax.text(
        0.98,
        0.03 + 0.2 * box,
        f"{label}: estimates, not measured. 2x data ({2 * hi} rows) adds\n"
        f"{fit['last_step_estimated_gain_from_doubling']:+.2f} tokens/step at the slope of the "
        f"last two sizes ({fit['last_step_rows'][0]} to {fit['last_step_rows'][1]} rows),\n"
        f"{fit['estimated_gain_from_doubling']:+.2f} on the log-linear fit over all "
        f"{fit['points']} points (largest residual {fit['max_abs_residual']:.2f})",
        transform=ax.transAxes,
        ha="right",
        va="bottom",
        fontsize=8,
        color=color,
        bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.9},
    )


def plot_data_scaling(rows: list[dict], keys: list[str], k: int, out_png) -> list[dict]:
    """Tokens per step against training rows for each line of data_fraction variants, on the
    held-out prompts and on each benchmark, with a log-linear fit drawn through the measured
    sizes and, dotted, out to twice the data; the labelled estimate of what doubling adds.
    Returns the fits (one per line and prompt set)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = [("held out", "")] + [(name, f"{name}_") for name in benchmark_names(rows)]
    fits = []
    fig, ax = plt.subplots(figsize=(8.5, 5.5))
    for line, members in _lines(rows, "data_fraction", keys):
        train_rows = [m["train_rows"] for m in members]
        for prompt_set, prefix in sets:
            label = f"{prompt_set}, {line}" if line != "all" else prompt_set
            tokens = [m.get(f"{prefix}tokens_per_step") for m in members]
            if any(t is None for t in tokens):
                continue
            (points,) = ax.plot(train_rows, tokens, "o" if not prefix else "s", label=f"served ({label})")
            est = [m["val_estimate_tokens_per_draft"] for m in members]
            if not prefix and any(e is not None for e in est):
                ax.plot(train_rows, est, "x", color=points.get_color(), label=f"trainer's estimate ({label})")
            fit = fit_data_scaling(train_rows, tokens, ceiling=k + 1)
            if fit is not None:
                _draw_scaling_fit(ax, label, train_rows, fit, k, points.get_color(), box=len(fits))
                fits.append({"line": line, "set": prompt_set, **fit})
    ax.set_xscale("log", base=2)
    ticks = sorted({r["train_rows"] for r in rows if r["train_rows"]} | {2 * f["largest_rows"] for f in fits})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set(
        xlabel="training rows (log scale)",
        ylabel="tokens per target step",
        title="Data scaling: acceptance vs training rows",
    )
    ax.legend(fontsize="x-small", loc="upper left")
    fig.tight_layout()
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return fits


def _log_comparison(rows: list[dict], fits: list[dict]) -> None:
    """The data-scaling estimates and each variant's served acceptance, into the job's log."""
    for f in fits:
        log.info(
            "data scaling (%s, %s): 2x data (%d rows) adds %+.3f tokens/step at the last step's slope, "
            "%+.3f on the log-linear fit",
            f["set"],
            f["line"],
            f["doubled_rows"],
            f["last_step_estimated_gain_from_doubling"],
            f["estimated_gain_from_doubling"],
        )
    for r in rows:
        log.info(
            "%s: %.3f tokens/step (trainer's estimate %s)",
            r["variant"],
            r["tokens_per_step"],
            r["val_estimate_tokens_per_draft"],
        )


def read_draft_acceptance(path) -> dict:
    """A variant's evaluation (`eval/acceptance.json`): the trained draft's entry on the
    held-out prompts (`acceptance`) and on each benchmark it was evaluated on (`benchmarks`)."""
    acc = read_json(path)
    if "draft" not in acc:
        raise EaglenestError("holds no evaluation of the trained draft", path)
    benchmarks = {
        name: entry["draft"] for name, entry in (acc.get("benchmarks") or {}).items() if "draft" in entry
    }
    return {"acceptance": acc["draft"], "benchmarks": benchmarks}


def compare_stage(
    *,
    names: list[str],
    settings: list[dict],
    base: list[bool],
    acceptance_files: list,
    metrics_files: list,
    coverage_files: list,
    train_benchmarks: list,
    reference_acceptance,
    keys: list[str],
    out_csv,
    out_plot,
    out_per_position,
    out_scaling=None,
    out_scaling_plot=None,
) -> list[dict]:
    """The `compare_variants` rule: every variant's served acceptance (held out and on each
    benchmark), the trainer's estimate of it, throughput and vocabulary coverage against the
    swept settings, as a CSV and plots;
    with data_fraction swept, the data-scaling fit as JSON and its plot. The run's own
    evaluation (`reference_acceptance`) gives no speculation's tokens/s."""
    import pandas as pd

    reference = read_json(reference_acceptance)
    k = reference["num_speculative_tokens"]
    no_spec_tps = (reference.get("no_spec") or {}).get("output_tokens_per_s")
    variants = [
        {
            "name": name,
            "is_base": base[i],
            "settings": settings[i],
            **read_draft_acceptance(acceptance_files[i]),
            "metrics": read_json(metrics_files[i]),
            "coverage": read_json(coverage_files[i]),
            "train_s": read_benchmark(train_benchmarks[i]).get("s"),
        }
        for i, name in enumerate(names)
    ]
    rows = comparison_rows(variants, keys, k, no_spec_tps)
    with atomic_path(out_csv) as tmp:
        pd.DataFrame(rows).to_csv(tmp, index=False)
    plot_comparison(rows, keys, no_spec_tps, out_plot)
    plot_per_position(
        {v["name"] + (" (base)" if v["is_base"] else ""): v["acceptance"] for v in variants},
        out_per_position,
        title="Per-position acceptance of each variant",
    )
    fits = []
    if out_scaling is not None:
        fits = plot_data_scaling(rows, keys, k, out_scaling_plot)
        write_json(
            out_scaling, {"fits": fits, "note": "estimates extrapolate a fit; only the points are measured"}
        )
    _log_comparison(rows, fits)
    return rows
