"""The folder speculators' trainer reads its data from: the tokenized rows as a dataset, each
linked to its hidden-state file in the shards (offline) or in hybrid mode's folder of kept
samples, and a sweep's fraction of the rows. Its own module: what the trainer reads, apart from
how it is run.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from eaglenest.core.errors import EaglenestError
from eaglenest.core.io import iter_jsonl
from eaglenest.training.sweep import training_subset

log = logging.getLogger(__name__)


def data_fraction_rows(tokenized_path, hp: dict, prompts_path=None) -> tuple[list[int] | None, dict, int]:
    """A sweep's `data_fraction` and `sources`: the rows trained and validated on (None: all),
    the hyperparameters with the train ratio that keeps the validation rows whole, the row
    count. `prompts_path` (the training prompts, which name each row's source) is read for
    `sources` only."""
    fraction = hp.get("data_fraction", 1.0)
    sources = hp.get("sources")
    if fraction >= 1 and not sources:
        return None, hp, sum(1 for _ in iter_jsonl(tokenized_path))
    of_row = row_sources(tokenized_path, prompts_path) if sources else None
    num_rows = len(of_row) if of_row else sum(1 for _ in iter_jsonl(tokenized_path))
    eligible = (lambda i: of_row[i] in sources) if sources else None
    subset, ratio = training_subset(
        num_rows, hp["train_data_ratio"], fraction, hp["seed"], tokenized_path, eligible
    )
    return subset, {**hp, "train_data_ratio": ratio}, len(subset)


def row_sources(tokenized_path, prompts_path) -> list[str]:
    """Each tokenized row's prompt source: a row's id is its prompt's, or that id with a
    response number (`:k`) or a turn number (`#k`) after it."""
    if prompts_path is None:
        raise EaglenestError("a sweep over sources needs the training prompts", tokenized_path)
    source_of = {r["id"]: r["source"] for r in iter_jsonl(prompts_path)}
    out = []
    for row in iter_jsonl(tokenized_path):
        pid = row["id"].split("#", 1)[0].split(":", 1)[0]
        if pid not in source_of:
            raise EaglenestError(
                f"tokenized row {row['id']!r} has no prompt in {prompts_path}", tokenized_path
            )
        out.append(source_of[pid])
    return out


def link_training_data(tokenized_path, shard_dirs, data_dir, kept=None, rows=None) -> Path:
    """Assemble the folder speculators' trainer reads: a `save_to_disk` dataset of the rows and
    `hidden_states/hs_{i}.safetensors` linking into the shards (no copy of the big files).
    Without shards (online, hybrid) `hidden_states` is empty, or is hybrid's `kept` folder,
    where the trainer keeps what it extracts. `rows` (indices into the tokenized rows, a
    sweep's data subset) picks the rows, renumbered in that order, each linked to its own file."""
    from datasets import Dataset

    data_dir = Path(data_dir)
    if data_dir.exists():
        shutil.rmtree(data_dir)
    all_rows = list(iter_jsonl(tokenized_path))
    picked = list(range(len(all_rows))) if rows is None else list(rows)
    hs_dir = data_dir / "hidden_states"
    data_dir.mkdir(parents=True)
    if kept is not None:
        hs_dir.symlink_to(Path(kept).resolve(), target_is_directory=True)
    else:
        hs_dir.mkdir()
    files = {f.name: f for shard in shard_dirs for f in Path(shard).glob("hs_*.safetensors")}
    if shard_dirs and len(files) != len(all_rows):
        raise EaglenestError(
            f"shards hold {len(files)} samples but {tokenized_path} has {len(all_rows)} rows",
            shard_dirs[0] if shard_dirs else None,
        )
    for i, row in enumerate(picked if shard_dirs else ()):
        (hs_dir / f"hs_{i}.safetensors").symlink_to(files[f"hs_{row}.safetensors"].resolve())
    rows = [all_rows[i] for i in picked]
    Dataset.from_dict(
        {
            "input_ids": [r["input_ids"] for r in rows],
            "loss_mask": [r["loss_mask"] for r in rows],
            "seq_len": [len(r["input_ids"]) for r in rows],
        }
    ).with_format("torch").save_to_disk(str(data_dir))
    return data_dir


def kept_hidden_states(run_dir, key: str) -> Path:
    """Hybrid mode's folder of kept samples for these hidden states (`key`: the plan, dtype,
    rows and target); folders kept for other hidden states are stale and removed."""
    # Lazy: it imports speculators' dataset module, which only online and hybrid runs use.
    from eaglenest.hidden_states.online import remove_pending

    root = Path(run_dir).resolve() / ".eaglenest" / "hidden_states_kept"
    for stale in root.iterdir() if root.exists() else ():
        if stale.name != key:
            log.info("removing hidden states kept for an earlier spec: %s", stale)
            shutil.rmtree(stale)
    folder = root / key
    folder.mkdir(parents=True, exist_ok=True)
    remove_pending(folder)
    log.info("hybrid: %d samples already kept in %s", len(list(folder.glob("hs_*.safetensors"))), folder)
    return folder
