"""speculators' epoch checkpoints and the training spec's folder that holds them: which are
whole, what one more takes, the last one copied to the stage's output, and the pruning of what
no training needs any more. Its own module: the stage, the trainer's failure on a full disk and
the benchmarks all read checkpoints, apart from how the trainer is run.
"""

from __future__ import annotations

import json
import logging
import shutil
import zipfile
from pathlib import Path

from eaglenest.core.io import atomic_path, human_bytes, read_json, write_json
from eaglenest.draft.config import draft_parameter_count
from eaglenest.hidden_states.shard_check import header_problem

log = logging.getLogger(__name__)


# Names the output a training folder trains for, so a later spec for it can prune this one.
OWNER_FILE = "owner.json"


def training_folder(run_dir, key: str, out_checkpoint) -> Path:
    """The training spec's own folder (`.eaglenest/train/<key>`), named for the output it trains
    (OWNER_FILE), so a later spec for the same output can prune it."""
    work = Path(run_dir).resolve() / ".eaglenest" / "train" / key
    work.mkdir(parents=True, exist_ok=True)
    write_json(work / OWNER_FILE, {"output": str(Path(out_checkpoint).resolve()), "spec": key})
    return work


def checkpoint_problem(folder: Path) -> str | None:
    """What is missing or cut short in one of speculators' epoch checkpoints (it writes them in
    place: a kill or a full disk can leave one half-written), or None."""

    model, optimizer = folder / "model.safetensors", folder / "optimizer_state_dict.pt"
    for f in (model, folder / "config.json", optimizer):
        if not f.exists():
            return f"no {f.name}"
    problem = header_problem(model, required=())
    if problem:
        return f"{model.name}: {problem}"
    try:
        json.loads((folder / "config.json").read_text())
        with zipfile.ZipFile(optimizer):  # torch.save writes a zip: a cut one has no directory
            pass
    except (ValueError, zipfile.BadZipFile) as e:
        return f"unreadable: {e}"
    return None


def remove_incomplete_checkpoints(save_path) -> None:
    """Delete half-written epoch checkpoints, so that speculators resumes from the last whole one."""
    save_path = Path(save_path)
    for folder in save_path.iterdir() if save_path.exists() else ():
        if folder.is_dir() and not folder.is_symlink() and folder.name.isdigit():
            problem = checkpoint_problem(folder)
            if problem:
                log.warning("removing the incomplete checkpoint %s (%s)", folder, problem)
                shutil.rmtree(folder)


def epochs_done(save_path) -> list[int]:
    """The epochs with a whole checkpoint."""
    save_path = Path(save_path)
    if not save_path.exists():
        return []
    return sorted(
        int(p.name)
        for p in save_path.iterdir()
        if p.is_dir() and not p.is_symlink() and p.name.isdigit() and checkpoint_problem(p) is None
    )


def checkpoint_bytes(save_path, draft_config: dict) -> int:
    """What one more checkpoint takes: the last one's size, else the draft's bf16 weights and
    about as much optimizer state."""
    done = epochs_done(save_path)
    if done:
        return sum(f.stat().st_size for f in (Path(save_path) / str(done[-1])).iterdir() if f.is_file())

    return 2 * 2 * draft_parameter_count(draft_config)


def keep_last_checkpoint(save_path: Path, out_checkpoint) -> list[int]:
    """Copy the last epoch's draft (config and weights, no optimizer) to the rule's output;
    return the epochs done."""
    final = epochs_done(save_path)
    if not final:
        raise RuntimeError(f"speculators wrote no checkpoint into {save_path}")
    with atomic_path(out_checkpoint, is_dir=True) as tmp:
        for name in ("config.json", "model.safetensors"):
            shutil.copy(save_path / str(final[-1]) / name, tmp / name)
    return final


def prune_after_training(work: Path, save_path: Path, out_checkpoint) -> int:
    """Once a spec's training is whole and kept in its output: the folders of earlier specs
    for the same output (a changed hyperparameter, a sweep variant's new settings), which no
    variant of the config trains any more, and this spec's checkpoints before its last epoch
    (each holds the optimizer state; speculators 0.9.0 also saves the frozen target embedding
    in every one: about 2.35 GB at Kimi's shape). Returns the bytes freed."""

    owner = str(Path(out_checkpoint).resolve())
    stale = [
        other
        for other in work.parent.iterdir()
        if other != work
        and (other / OWNER_FILE).is_file()
        and read_json(other / OWNER_FILE).get("output") == owner
    ]
    last = epochs_done(save_path)[-1]
    stale += [p for p in save_path.iterdir() if p.is_dir() and p.name.isdigit() and int(p.name) != last]
    freed = 0
    for folder in stale:
        freed += sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())
        shutil.rmtree(folder)
    # speculators' links to its checkpoints (epoch<N>_end, checkpoint_best) that now point nowhere.
    for link in save_path.iterdir():
        if link.is_symlink() and not link.exists():
            link.unlink()
    if stale:
        log.info(
            "pruned %d superseded training folders and checkpoints: %s freed", len(stale), human_bytes(freed)
        )
    return freed
