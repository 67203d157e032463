"""The draft vocabulary: which target token ids the draft head may propose.

An EAGLE-3 draft head predicts over a pruned vocabulary to save compute in its LM head. The
pruned set is the `draft_vocab_size` ids that carried the most loss-masked (assistant) tokens
in the training data, plus any ids the user insists on keeping (special tokens). The result is
stored the way speculators' trainer and vLLM expect it:

- `t2d`: bool [target_vocab], True for the selected ids;
- `d2t`: int64 [draft_vocab], offsets, so that `target_id = draft_id + d2t[draft_id]`.

Selection rules (exact, so reruns and other tools agree): always-kept ids first, then the
highest counts, ties to the lower id; ids never seen (count 0) rank after every seen id in
ascending id order, so a short data set fills its remaining slots with the lowest unused ids.
These are speculators' own rules, computed with one stable vectorised sort instead of a Python
sort over a dict, and the same sort gives the coverage curve for every candidate size.

The arithmetic is done in numpy, single-threaded on purpose: torch's OpenMP sort on a busy node
(Snakemake runs several jobs at once) was measured 70x slower than on an idle one, while a
163k-element sort needs no threads.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from eaglenest.core.errors import EaglenestError
from eaglenest.core.io import atomic_path, save_tensor
from eaglenest.target.resolve import read_shape

logger = logging.getLogger(__name__)

# Draft sizes people actually pick; reported in the coverage curve whenever they fit.
STANDARD_DRAFT_SIZES = (8000, 16000, 32000, 64000)

__all__ = [
    "MappingPaths",
    "VocabMapping",
    "build_vocab_mapping",
    "compute_vocab_mapping",
    "coverage_sizes",
    "load_token_counts",
    "mapping_stage",
    "write_coverage_plot",
]


@dataclass(frozen=True)
class MappingPaths:
    """Where the mapping files go; the CLI puts them in one folder, Snakemake names each."""

    t2d_pt: Path
    d2t_pt: Path
    t2d_npy: Path
    d2t_npy: Path
    coverage_json: Path
    coverage_plot: Path | None = None

    def __post_init__(self):  # accept str paths (Snakemake hands out str)
        for name, value in vars(self).items():
            if value is not None:
                object.__setattr__(self, name, Path(value))

    @classmethod
    def in_dir(cls, out_dir, coverage_plot=None) -> MappingPaths:
        d = Path(out_dir)
        return cls(
            t2d_pt=d / "t2d.pt",
            d2t_pt=d / "d2t.pt",
            t2d_npy=d / "t2d.npy",
            d2t_npy=d / "d2t.npy",
            coverage_json=d / "vocab_coverage.json",
            coverage_plot=None if coverage_plot is None else Path(coverage_plot),
        )


@dataclass(frozen=True)
class VocabMapping:
    """The computed mapping and its coverage figures, before anything touches the disk."""

    t2d: torch.Tensor  # bool [target_vocab]
    d2t: torch.Tensor  # int64 [draft_vocab], offsets
    selected_ids: torch.Tensor  # int64 [draft_vocab], ascending
    coverage: dict
    curve_sizes: np.ndarray  # every valid draft size up to target_vocab, for plotting
    curve_shares: np.ndarray


# --------------------------------------------------------------------------------------------
# Reading inputs


def _as_int64_counts(values: np.ndarray, path, what: str, dtype_name: str, ids=None):
    """Integer counts as int64; whole-number floats are accepted, anything else is not.

    `ids` are the token ids of `values` when they are not simply 0..n-1 (the dict form).
    """
    kind = values.dtype.kind
    if kind not in "iuf":  # bool, complex, strings, objects
        raise EaglenestError(f"{what} have dtype {dtype_name}; expected integer counts", path)
    if kind == "f":
        if not np.isfinite(values).all():
            raise EaglenestError(f"{what} contain NaN or infinite values", path)
        if not (values == np.round(values)).all():
            raise EaglenestError(
                f"{what} have dtype {dtype_name} with non-integral values; expected integer counts",
                path,
            )
    values = values.astype(np.int64, copy=False)
    if values.size and values.min() < 0:
        bad = np.flatnonzero(values < 0)[:5]
        bad = (bad if ids is None else ids[bad]).tolist()
        raise EaglenestError(f"{what} contain negative counts (first at ids {bad})", path)
    return values


def _dict_to_dense(freq: Mapping, target_vocab_size: int | None, path) -> np.ndarray:
    """speculators' `{token_id: count}` form as a dense count array."""
    if target_vocab_size is None:
        raise EaglenestError(
            "a {token_id: count} dict does not say the target vocabulary size; give the "
            "target model's config (or the vocabulary size) as well",
            path,
        )
    counts = np.zeros(target_vocab_size, dtype=np.int64)
    if not freq:
        return counts
    try:
        ids = np.asarray(list(freq.keys()))
        values = np.asarray(list(freq.values()))
    except (TypeError, ValueError, OverflowError) as e:
        raise EaglenestError(f"dict keys and values must be integers ({e})", path) from None
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise EaglenestError("dict keys must be integer token ids", path)
    if values.ndim != 1:
        raise EaglenestError("dict values must be scalar integer counts", path)
    values = _as_int64_counts(values, path, "dict values", str(values.dtype), ids=ids)
    out_of_range = (ids < 0) | (ids >= target_vocab_size)
    if out_of_range.any():
        bad = ids[out_of_range][:5].tolist()
        raise EaglenestError(
            f"{int(out_of_range.sum())} token ids out of range for target vocabulary size "
            f"{target_vocab_size} (e.g. {bad})",
            path,
        )
    counts[ids] = values
    return counts


def load_token_counts(token_freq, target_vocab_size: int | None = None) -> np.ndarray:
    """Read `token_freq.pt` as a dense int64 count array of the target vocabulary's length.

    Accepts the dense tensor eaglenest writes and speculators' `{token_id: count}` dict (which
    needs `target_vocab_size`, since a dict cannot say how many ids were never seen). Loaded
    with `weights_only=True`, so a file from elsewhere cannot run code.
    """
    path = Path(token_freq)
    if not path.is_file():
        raise EaglenestError("file does not exist", path)
    try:
        obj = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as e:  # pickle, zip and torch errors all mean the same thing here
        problem = f"cannot read as a torch file ({type(e).__name__}: {e})"
        raise EaglenestError(problem, path) from None
    if isinstance(obj, Mapping):
        return _dict_to_dense(obj, target_vocab_size, path)
    if not isinstance(obj, torch.Tensor):
        raise EaglenestError(
            f"expected a 1-D count tensor or a {{token_id: count}} dict, got {type(obj).__name__}",
            path,
        )
    if obj.dim() != 1:
        raise EaglenestError(f"expected a 1-D count tensor, got shape {list(obj.shape)}", path)
    if obj.dtype == torch.bool or obj.is_complex():
        raise EaglenestError(f"counts have dtype {obj.dtype}; expected integer counts", path)
    obj = obj.detach()
    if obj.dtype in (torch.float16, torch.bfloat16):  # no numpy twin
        obj = obj.float()
    counts = _as_int64_counts(obj.numpy(), path, "counts", str(obj.dtype))
    if target_vocab_size is not None and counts.size != target_vocab_size:
        raise EaglenestError(
            f"count tensor has length {counts.size} but the target vocabulary size is {target_vocab_size}",
            path,
        )
    return counts


# --------------------------------------------------------------------------------------------
# Computing


def coverage_sizes(target_vocab_size: int, draft_vocab_size: int, min_size: int = 1) -> list[int]:
    """Draft sizes to report coverage for: powers of two, the usual sizes, the chosen one.

    Powers of two keep the curve meaningful on a toy 2k vocabulary as well as on a 150k one.
    """
    sizes = {draft_vocab_size, target_vocab_size}
    sizes.update(s for s in STANDARD_DRAFT_SIZES if s <= target_vocab_size)
    sizes.update(1 << k for k in range(target_vocab_size.bit_length()))  # all <= target
    return sorted(s for s in sizes if s >= max(min_size, 1))


def _validate_request(
    target_vocab_size: int, draft_vocab_size: int, always_keep_ids: Iterable[int], path
) -> np.ndarray:
    """Check the size and always-kept ids against the vocabulary; return the kept ids, sorted."""
    n = draft_vocab_size
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise EaglenestError(f"draft vocabulary size must be an integer, got {n!r}", path)
    if n < 1:
        raise EaglenestError(f"draft vocabulary size must be at least 1, got {n}", path)
    if n > target_vocab_size:
        raise EaglenestError(
            f"draft vocabulary size {n} exceeds the target vocabulary size {target_vocab_size}",
            path,
        )
    keep = list(always_keep_ids or ())
    if any(isinstance(i, bool) or not isinstance(i, (int, np.integer)) for i in keep):
        raise EaglenestError(f"always-kept ids must be integers, got {keep!r}", path)
    kept = np.unique(np.asarray(keep, dtype=np.int64))  # sorted, duplicates dropped
    bad = kept[(kept < 0) | (kept >= target_vocab_size)]
    if bad.size:
        raise EaglenestError(
            f"always-kept ids {bad.tolist()} out of range for target vocabulary size {target_vocab_size}",
            path,
        )
    if kept.size > n:
        raise EaglenestError(f"{kept.size} always-kept ids do not fit in a draft vocabulary of {n}", path)
    return kept


def _check_total(counts: np.ndarray, source) -> int:
    """The counts' total; zero means there is nothing to choose from."""
    total = int(counts.sum())
    if total == 0:
        raise EaglenestError(
            "every count is zero: no loss-masked tokens were counted, so there is nothing to "
            "choose a draft vocabulary from",
            source,
        )
    return total


def _select_ids(
    counts: np.ndarray, kept: np.ndarray, draft_vocab_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The kept ids and the top-ranked others: (t2d, the selected ids ascending, the ranked rest)."""
    # Rank by count descending, ties (zeros included) to the lower id: a stable ascending sort
    # of -count keeps equal keys in id order.
    order = np.argsort(-counts, kind="stable")
    is_kept = np.zeros(counts.size, dtype=bool)
    is_kept[kept] = True
    rest = order[~is_kept[order]]  # ranked non-kept ids; kept ids take the first slots

    t2d = is_kept.copy()
    t2d[rest[: draft_vocab_size - int(kept.size)]] = True
    selected = np.flatnonzero(t2d).astype(np.int64, copy=False)  # ascending
    return t2d, selected, rest


def _coverage(
    counts: np.ndarray, kept: np.ndarray, rest: np.ndarray, draft_vocab_size: int, total: int
) -> tuple[dict, np.ndarray, np.ndarray]:
    """The chosen size's coverage figures, and the curve over every valid size (sizes, shares)."""
    target_vocab_size = int(counts.size)
    n_kept = int(kept.size)
    # Coverage for every valid size s at once: the kept ids' mass plus the top (s - n_kept)
    # others' mass, read off one cumulative sum.
    start = max(n_kept, 1)  # smaller sizes could not hold the kept ids
    top_mass = np.concatenate(([0], np.cumsum(counts[rest])))
    mass = int(counts[kept].sum()) + top_mass[start - n_kept :]  # sizes start..target_vocab
    shares = mass / total
    sizes = np.arange(start, target_vocab_size + 1)

    covered = int(mass[draft_vocab_size - start])
    coverage = {
        "target_vocab_size": target_vocab_size,
        "draft_vocab_size": draft_vocab_size,
        "total_masked_tokens": total,
        "distinct_ids_seen": int(np.count_nonzero(counts)),
        "coverage": covered / total,
        "always_kept_ids": kept.tolist(),
        "coverage_at_sizes": {
            str(s): float(shares[s - start])
            for s in coverage_sizes(target_vocab_size, draft_vocab_size, min_size=start)
        },
    }
    return coverage, sizes, shares


def compute_vocab_mapping(
    counts,
    draft_vocab_size: int,
    always_keep_ids: Iterable[int] = (),
    *,
    source=None,
) -> VocabMapping:
    """Select the draft ids from dense counts; one stable sort serves selection and coverage.

    `counts` is a 1-D integer array or tensor over the whole target vocabulary; `source` only
    names the input in error messages.
    """
    counts = np.asarray(counts, dtype=np.int64)
    if counts.ndim != 1:
        raise EaglenestError(f"expected 1-D counts, got shape {list(counts.shape)}", source)
    target_vocab_size = int(counts.size)
    kept = _validate_request(target_vocab_size, draft_vocab_size, always_keep_ids, source)
    draft_vocab_size = int(draft_vocab_size)
    total = _check_total(counts, source)
    t2d, selected, rest = _select_ids(counts, kept, draft_vocab_size)
    d2t = selected - np.arange(draft_vocab_size, dtype=np.int64)
    coverage, sizes, shares = _coverage(counts, kept, rest, draft_vocab_size=draft_vocab_size, total=total)
    return VocabMapping(
        torch.from_numpy(t2d),
        torch.from_numpy(d2t),
        torch.from_numpy(selected),
        coverage,
        sizes,
        shares,
    )


# --------------------------------------------------------------------------------------------
# Writing


def _draw_coverage(mapping: VocabMapping):
    """Coverage against draft size (log x), with the chosen size marked."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a cluster node
    import matplotlib.pyplot as plt

    cov = mapping.coverage
    sizes, shares = mapping.curve_sizes, mapping.curve_shares
    # A few hundred log-spaced points draw the same curve as 150k of them.
    idx = np.unique(np.geomspace(1, len(sizes), num=min(len(sizes), 400)).astype(np.int64) - 1)
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    ax.plot(sizes[idx], shares[idx], lw=1.5)
    n, c = cov["draft_vocab_size"], cov["coverage"]
    ax.axvline(n, color="tab:red", ls="--", lw=1)
    ax.plot([n], [c], "o", color="tab:red")
    ax.annotate(f"{n}: {c:.2%}", (n, c), textcoords="offset points", xytext=(-8, -14), ha="right")
    ax.set_xscale("log")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("draft vocabulary size")
    ax.set_ylabel("share of masked tokens covered")
    ax.set_title(f"Draft vocabulary coverage (target vocabulary {cov['target_vocab_size']})")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return plt, fig


def _plot_into(tmp: Path, mapping: VocabMapping) -> None:
    plt, fig = _draw_coverage(mapping)
    try:
        fig.savefig(tmp, format="png")  # the temp name has no .png suffix to infer it from
    finally:
        plt.close(fig)


def write_coverage_plot(path, mapping: VocabMapping) -> None:
    """Write the coverage plot on its own, atomically."""
    with atomic_path(path) as tmp:
        _plot_into(tmp, mapping)


def _save_npy(array: np.ndarray) -> Callable[[Path], None]:
    # np.save given a name appends ".npy" to the temp name, so hand it an open file instead.
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            np.save(f, array)

    return write


def _write_all(writers: Sequence[tuple[Path, Callable[[Path], None]]]) -> None:
    """Write every file under a temp name, then rename them all: all land or none do."""
    renamed: list[Path] = []

    @contextlib.contextmanager
    def tracked(path: Path):
        with atomic_path(path) as tmp:
            yield tmp
        renamed.append(path)

    try:
        with contextlib.ExitStack() as stack:
            for path, write in writers:
                write(stack.enter_context(tracked(Path(path))))
    except BaseException:
        for path in renamed:  # a rename failed part-way: take back the ones that landed
            path.unlink(missing_ok=True)
        raise


def build_vocab_mapping(
    token_freq,
    draft_vocab_size: int,
    paths: MappingPaths,
    *,
    target_config=None,
    target_vocab_size: int | None = None,
    always_keep_ids: Iterable[int] = (),
    forced_special_tokens: Mapping[int, str] | None = None,
) -> dict:
    """From `token_freq.pt` to t2d/d2t (.pt and .npy), vocab_coverage.json and optional plot.

    The target vocabulary size comes from `target_config` (config.json or the model folder) or
    `target_vocab_size`; with neither, a dense count tensor's length is taken as it. Everything
    is validated and computed before the first write, and the files are renamed into place
    together, so bad input leaves nothing behind. Returns the coverage report.
    """
    if target_config is not None and target_vocab_size is not None:
        raise EaglenestError("give the target config or the target vocabulary size, not both", target_config)
    if target_config is not None:
        target_vocab_size = read_shape(target_config, require=("vocab_size",)).vocab_size
    elif target_vocab_size is not None and (
        isinstance(target_vocab_size, bool) or int(target_vocab_size) < 1
    ):
        raise EaglenestError(f"target vocabulary size must be positive, got {target_vocab_size!r}")

    counts = load_token_counts(token_freq, target_vocab_size)
    forced = dict(sorted((forced_special_tokens or {}).items()))
    keep = list(dict.fromkeys([*always_keep_ids, *forced]))
    mapping = compute_vocab_mapping(counts, draft_vocab_size, keep, source=token_freq)
    mapping.coverage["forced_special_tokens"] = {str(i): t for i, t in forced.items()}

    t2d, d2t = mapping.t2d, mapping.d2t
    coverage_text = json.dumps(mapping.coverage, indent=2) + "\n"
    writers: list[tuple[Path, Callable[[Path], None]]] = [
        (paths.t2d_pt, lambda tmp: save_tensor(t2d, tmp)),
        (paths.d2t_pt, lambda tmp: save_tensor(d2t, tmp)),
        (paths.t2d_npy, _save_npy(t2d.numpy())),
        (paths.d2t_npy, _save_npy(d2t.numpy())),
        (paths.coverage_json, lambda tmp: tmp.write_text(coverage_text)),
    ]
    if paths.coverage_plot is not None:
        writers.append((paths.coverage_plot, lambda tmp: _plot_into(tmp, mapping)))
    _write_all(writers)

    cov = mapping.coverage
    logger.info(
        "draft vocabulary: %d of %d ids cover %.4f of %d masked tokens (%d distinct ids seen, "
        "%d always kept) -> %s",
        cov["draft_vocab_size"],
        cov["target_vocab_size"],
        cov["coverage"],
        cov["total_masked_tokens"],
        cov["distinct_ids_seen"],
        len(cov["always_kept_ids"]),
        paths.coverage_json.parent,
    )
    return cov


def mapping_stage(
    *,
    token_freq,
    draft_vocab_size: int,
    target,
    always_keep_ids: Iterable[int],
    t2d_pt,
    d2t_pt,
    t2d_npy,
    d2t_npy,
    coverage_json,
    coverage_plot,
    metadata=None,
) -> dict:
    """The build_vocab_mapping rule: the mapping for the resolved target's vocabulary. The
    tokenizer's added tokens that tokenize found in supervised spans (`metadata`'s
    supervised_special_tokens: tool-call markup, think tags, end of turn) always get a draft
    slot, however rare: a draft that cannot propose the end of a call stops every call's run."""
    forced = {}
    if metadata is not None:
        supervised = json.loads(Path(metadata).read_text()).get("supervised_special_tokens") or {}
        forced = {int(i): token for i, token in supervised.items()}
    paths = MappingPaths(
        t2d_pt, d2t_pt, t2d_npy, d2t_npy, coverage_json=coverage_json, coverage_plot=coverage_plot
    )
    return build_vocab_mapping(
        token_freq,
        draft_vocab_size,
        paths,
        target_vocab_size=target.shape["vocab_size"],
        always_keep_ids=always_keep_ids,
        forced_special_tokens=forced,
    )
