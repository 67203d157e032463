"""Stage `prepare_prompts`: gather the prompts the target model will answer.

Reads one or more *sources*, normalises every row to one schema, drops what cannot be used
(counting why), deduplicates, samples each source down to its requested size, holds out an
evaluation split, and writes three files atomically (all three, or none on error):

- ``prompts.jsonl``       training prompts, one ``{"id", "source", "messages"}`` object a line;
- ``eval_prompts.jsonl``  held-out prompts, same schema, never in ``prompts.jsonl``;
- ``prompts_stats.json``  counts per source and per drop reason, and the split sizes.

Sources
-------
``sources`` is a list of dicts (the ``prompts.sources`` list of the config). Every source has

- ``name``    (required, unique): labels its rows (``"source"`` field) and its stats;
- ``type``    (required): ``bundled``, ``jsonl``, ``parquet`` or ``hf``;
- ``samples`` (optional): how many rows to draw from it; absent or ``null`` means all of them.
  **This is the only mixing control**: the share of each source in the output is set by its
  ``samples``. There are no weights.

and, by type:

- ``bundled``: ``path`` (default ``default.jsonl``), a file under the repository's
  ``data/prompts/`` folder, found from the package's location so it works from any directory;
- ``jsonl`` / ``parquet``: ``path`` (required), a local file (relative to the working directory);
- ``hf``: ``dataset`` (required), given to ``datasets.load_dataset`` as is, so it is either a
  Hub name (``HuggingFaceH4/ultrachat_200k``) or a local folder or file that ``load_dataset``
  reads (a folder of jsonl/parquet files); optional ``subset`` (the config name), ``split``
  (default ``train``) and ``revision``. Set ``HF_HUB_OFFLINE=1`` to forbid network access.

Any other key is an error, so a misspelt option is never silently ignored. Example::

    prompts:
      seed: 0
      eval_samples: 16
      sources:
        - {name: default, type: bundled}
        - {name: ultrachat, type: hf, dataset: HuggingFaceH4/ultrachat_200k,
           split: train_sft, samples: 2000}

Rows
----
A row is read from the first of these fields that it has:

- ``messages``: a list of ``{"role", "content"}`` with roles ``system``/``user``/``assistant``;
- ``conversations``: ShareGPT, a list of ``{"from", "value"}``; ``human``/``user`` become
  ``user``, ``gpt``/``assistant``/``chatgpt``/``bing``/``bard`` become ``assistant``,
  ``system`` stays ``system``;
- ``prompt``: a plain string, one user turn.

Roles are matched case-insensitively; contents are stripped of surrounding whitespace; an empty
*system* turn is removed (many ShareGPT dumps carry one). The prompt is the conversation up to
and including its last user turn: the assistant reply after it is what the target regenerates,
earlier assistant turns stay as history.

Dropped rows, by reason (all counted in the stats): ``malformed`` (no usable field, a turn that
is not an object, a missing role/content, a non-string content), ``unknown_role``,
``empty_conversation``, ``no_user_turn``, ``empty_content`` (an empty user/assistant turn in
the prompt) and ``duplicate``. A line of bad JSON in a local JSONL file is not a dropped row
but an error naming the file and line.

Ids, dedupe, sampling, split
----------------------------
A row's id is the first 16 hex digits of the sha256 of its normalised messages as canonical
JSON (sorted keys, no spaces, UTF-8), so the same prompt has the same id in every run and from
every source. Rows are deduplicated on the id across all sources, in source order, the first one
kept; then each source is sampled without replacement down to ``samples`` with a generator
seeded by ``seed`` and the source's name (a source with fewer usable rows gives all it has and
its stats say ``short: true``). Sampled rows keep their source order. Finally ``eval_samples``
rows, chosen with a generator seeded by ``seed``, form the evaluation split.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from collections.abc import Iterable, Iterator
from pathlib import Path

from eaglenest.core.errors import EaglenestError
from eaglenest.core.io import atomic_path, iter_jsonl

log = logging.getLogger(__name__)

#: The repository's bundled prompt files (eaglenest/../data/prompts).
BUNDLED_DIR = Path(__file__).resolve().parents[2] / "data" / "prompts"
DEFAULT_BUNDLED = "default.jsonl"

SOURCE_TYPES = ("bundled", "jsonl", "parquet", "hf")
_COMMON_KEYS = {"name", "type", "samples"}
_TYPE_KEYS = {
    "bundled": {"path"},
    "jsonl": {"path"},
    "parquet": {"path"},
    "hf": {"dataset", "subset", "split", "revision"},
}

DROP_REASONS = (
    "malformed",
    "unknown_role",
    "empty_conversation",
    "no_user_turn",
    "empty_content",
    "duplicate",
)

_MESSAGE_ROLES = {"system": "system", "user": "user", "assistant": "assistant"}
_SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
}


class UnusableRow(Exception):
    """A row that cannot be used; `reason` is one of DROP_REASONS."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(detail or reason)
        self.reason = reason


# --------------------------------------------------------------------------------------------
# Rows


def _turns(turns, role_key: str, content_key: str, role_map: dict) -> list[dict]:
    if turns is None or isinstance(turns, (str, bytes, dict)):
        raise UnusableRow("malformed", "conversation is not a list")
    try:
        turns = list(turns)
    except TypeError:
        raise UnusableRow("malformed", "conversation is not a list") from None
    if not turns:
        raise UnusableRow("empty_conversation")
    out = []
    for turn in turns:
        if not isinstance(turn, dict):
            raise UnusableRow("malformed", "a turn is not an object")
        role, content = turn.get(role_key), turn.get(content_key)
        if not isinstance(role, str):
            raise UnusableRow("malformed", f"a turn has no string '{role_key}'")
        if not isinstance(content, str):
            raise UnusableRow("malformed", f"a turn has no string '{content_key}'")
        mapped = role_map.get(role.strip().lower())
        if mapped is None:
            raise UnusableRow("unknown_role", f"unknown role {role!r}")
        out.append({"role": mapped, "content": content.strip()})
    return out


def normalise_row(row: dict) -> list[dict]:
    """The prompt messages of one source row; raises `UnusableRow` when the row is unusable."""
    if not isinstance(row, dict):
        raise UnusableRow("malformed", "row is not an object")
    if row.get("messages") is not None:
        turns = _turns(row["messages"], "role", "content", _MESSAGE_ROLES)
    elif row.get("conversations") is not None:
        turns = _turns(row["conversations"], "from", "value", _SHAREGPT_ROLES)
    elif row.get("prompt") is not None:
        if not isinstance(row["prompt"], str):
            raise UnusableRow("malformed", "'prompt' is not a string")
        turns = [{"role": "user", "content": row["prompt"].strip()}]
    else:
        raise UnusableRow("malformed", "no 'messages', 'conversations' or 'prompt' field")

    turns = [t for t in turns if not (t["role"] == "system" and not t["content"])]
    last_user = max((i for i, t in enumerate(turns) if t["role"] == "user"), default=None)
    if last_user is None:
        raise UnusableRow("no_user_turn")
    turns = turns[: last_user + 1]
    if any(not t["content"] for t in turns):
        raise UnusableRow("empty_content")
    return turns


def prompt_id(messages: list[dict]) -> str:
    """Stable id: sha256 of the messages' canonical JSON, first 16 hex digits."""
    canon = json.dumps(messages, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()[:16]


# --------------------------------------------------------------------------------------------
# Sources


def _check_source(i: int, src) -> dict:
    where = f"prompts source #{i + 1}"
    if not isinstance(src, dict):
        raise EaglenestError(f"{where}: expected a mapping, got {type(src).__name__}")
    name = src.get("name")
    if not isinstance(name, str) or not name.strip():
        raise EaglenestError(f"{where}: needs a non-empty string 'name'")
    where = f"prompts source '{name}'"
    kind = src.get("type")
    if kind not in SOURCE_TYPES:
        raise EaglenestError(f"{where}: unknown type {kind!r} (expected one of {', '.join(SOURCE_TYPES)})")
    extra = set(src) - _COMMON_KEYS - _TYPE_KEYS[kind]
    if "weight" in extra:
        raise EaglenestError(f"{where}: 'weight' is not supported; set 'samples' to size the mix")
    if extra:
        allowed = sorted(_COMMON_KEYS | _TYPE_KEYS[kind])
        raise EaglenestError(
            f"{where}: unknown key(s) {', '.join(sorted(extra))} for type {kind} "
            f"(allowed: {', '.join(allowed)})"
        )
    samples = src.get("samples")
    if samples is not None and (isinstance(samples, bool) or not isinstance(samples, int) or samples < 1):
        raise EaglenestError(f"{where}: 'samples' must be a positive integer or null, got {samples!r}")
    if kind in ("jsonl", "parquet") and not isinstance(src.get("path"), str):
        raise EaglenestError(f"{where}: type {kind} needs a 'path'")
    if kind == "bundled" and not isinstance(src.get("path", DEFAULT_BUNDLED), str):
        raise EaglenestError(f"{where}: 'path' must be a string")
    if kind == "hf":
        if not isinstance(src.get("dataset"), str) or not src["dataset"]:
            raise EaglenestError(f"{where}: type hf needs a 'dataset'")
        for key in ("subset", "split", "revision"):
            if src.get(key) is not None and not isinstance(src[key], str):
                raise EaglenestError(f"{where}: '{key}' must be a string")
    return src


def _read_parquet(path: Path, name: str) -> list[dict]:
    if not path.exists():
        raise EaglenestError("file does not exist", path)
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except Exception as e:  # pyarrow raises several types for a broken file
        raise EaglenestError(f"source '{name}': cannot read as parquet ({e})", path) from None


def _read_hf(src: dict) -> Iterator[dict]:
    import datasets

    name, dataset = src["name"], src["dataset"]
    split = src.get("split") or "train"
    what = f"dataset {dataset!r}" + (f" subset {src['subset']!r}" if src.get("subset") else "")
    what += f" split {split!r}" + (f" revision {src['revision']!r}" if src.get("revision") else "")
    try:
        ds = datasets.load_dataset(dataset, name=src.get("subset"), split=split, revision=src.get("revision"))
    except Exception as e:  # hub, network, missing split/config: all the user's to fix
        raise EaglenestError(
            f"source '{name}': cannot load Hugging Face {what}: {type(e).__name__}: {e}"
        ) from e
    log.info("source %s: loaded %s (%d rows)", name, what, len(ds))
    return iter(ds)


def _bundled_path(src: dict) -> Path:
    return BUNDLED_DIR / src.get("path", DEFAULT_BUNDLED)


def read_source(src: dict) -> tuple[Iterable[dict], str | None]:
    """The raw rows of a (checked) source, and the file they come from if it is a file."""
    kind = src["type"]
    if kind == "hf":
        return _read_hf(src), None
    path = _bundled_path(src) if kind == "bundled" else Path(src["path"]).expanduser()
    if not path.exists():
        raise EaglenestError(f"source '{src['name']}': file does not exist", path)
    if kind == "parquet" or (kind == "bundled" and path.suffix == ".parquet"):
        return _read_parquet(path, src["name"]), str(path)
    return iter_jsonl(path), str(path)


# --------------------------------------------------------------------------------------------
# The stage


def sample_rows(rows: list, k: int | None, rng: random.Random) -> list:
    if k is None or k >= len(rows):
        return list(rows)
    keep = sorted(rng.sample(range(len(rows)), k))
    return [rows[i] for i in keep]


def _checked_sources(sources) -> list[dict]:
    """Each source checked; a list that is empty or repeats a name is refused."""
    if not isinstance(sources, (list, tuple)) or not sources:
        raise EaglenestError("prompts: 'sources' must be a non-empty list")
    checked = [_check_source(i, s) for i, s in enumerate(sources)]
    names = [s["name"] for s in checked]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise EaglenestError(f"prompts: source names must be unique, repeated: {', '.join(dupes)}")
    return checked


def _usable_rows(raw, name: str, seen: set[str]) -> tuple[list[dict], dict, int]:
    """A source's rows normalised, less the unusable and those `seen` already (which it extends):
    (usable rows, drops by reason, rows read)."""
    drops = dict.fromkeys(DROP_REASONS, 0)
    usable: list[dict] = []
    n_in = 0
    for row in raw:
        n_in += 1
        try:
            messages = normalise_row(row)
        except UnusableRow as d:
            drops[d.reason] += 1
            continue
        pid = prompt_id(messages)
        if pid in seen:
            drops["duplicate"] += 1
            continue
        seen.add(pid)
        usable.append({"id": pid, "source": name, "messages": messages})
    return usable, drops, n_in


def collect(sources: list[dict], seed: int) -> tuple[list[dict], dict, dict]:
    """Read, normalise, dedupe and sample all sources; return (rows, per-source stats, drops)."""
    checked = _checked_sources(sources)

    seen: set[str] = set()
    total_drops = dict.fromkeys(DROP_REASONS, 0)
    per_source: dict[str, dict] = {}
    rows: list[dict] = []
    for src in checked:
        name = src["name"]
        raw, path = read_source(src)
        usable, drops, n_in = _usable_rows(raw, name, seen)
        if not usable:
            why = ", ".join(f"{k}={v}" for k, v in drops.items() if v) or "it has no rows"
            raise EaglenestError(
                f"source '{name}' yielded no usable rows ({n_in} read; dropped: {why})", path
            )
        requested = src.get("samples")
        picked = sample_rows(usable, requested, random.Random(f"{seed}/source/{name}"))
        short = requested is not None and len(usable) < requested
        per_source[name] = {
            "type": src["type"],
            "path": path,
            "rows_in": n_in,
            "dropped": drops,
            "usable": len(usable),
            "requested": requested,
            "kept": len(picked),
            "short": short,
        }
        for k, v in drops.items():
            total_drops[k] += v
        log.info(
            "source %s: %d rows in, %d usable, %d kept%s; dropped %s",
            name,
            n_in,
            len(usable),
            len(picked),
            f" (asked for {requested}, short)" if short else "",
            {k: v for k, v in drops.items() if v} or "none",
        )
        rows.extend(picked)
    return rows, per_source, total_drops


def split_eval(rows: list[dict], eval_samples: int, seed: int) -> tuple[list[dict], list[dict]]:
    """Deterministically hold out `eval_samples` rows; return (train, eval), both in input order."""
    if isinstance(eval_samples, bool) or not isinstance(eval_samples, int) or eval_samples < 0:
        raise EaglenestError(f"prompts: 'eval_samples' must be a non-negative integer, got {eval_samples!r}")
    if eval_samples >= len(rows):
        raise EaglenestError(
            f"prompts: eval_samples ({eval_samples}) must be smaller than the number of prompts "
            f"kept ({len(rows)}), or nothing is left to train on"
        )
    held = set(random.Random(f"{seed}/eval").sample(range(len(rows)), eval_samples))
    train = [r for i, r in enumerate(rows) if i not in held]
    evals = [r for i, r in enumerate(rows) if i in held]
    return train, evals


def prepare_stage(
    sources: list[dict], eval_samples: int, seed: int, train_path, eval_path, stats_path
) -> dict:
    """Run the stage: write train/eval prompts and their stats; return the stats."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise EaglenestError(f"prompts: 'seed' must be an integer, got {seed!r}")
    rows, per_source, drops = collect(sources, seed)
    train, evals = split_eval(rows, eval_samples, seed)
    stats = {
        "seed": seed,
        "eval_samples": eval_samples,
        "rows_in": sum(s["rows_in"] for s in per_source.values()),
        "kept": len(rows),
        "train": len(train),
        "eval": len(evals),
        "dropped": drops,
        "sources": per_source,
    }
    # Nested: every file is complete under its temporary name before any is renamed into place.
    with (
        atomic_path(train_path) as t_train,
        atomic_path(eval_path) as t_eval,
        atomic_path(stats_path) as t_stats,
    ):
        _dump_jsonl(t_train, train)
        _dump_jsonl(t_eval, evals)
        t_stats.write_text(json.dumps(stats, indent=2) + "\n")
    log.info(
        "prompts: %d train, %d eval (of %d kept, %d read)",
        len(train),
        len(evals),
        len(rows),
        stats["rows_in"],
    )
    return stats


def _dump_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
