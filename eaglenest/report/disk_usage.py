"""How much a run folder holds, by stage: `eaglenest disk-usage RUN_DIR`.

Each stage writes its own folder of the run (prompts/, responses/, tokenized/, vocab/,
hidden_states/, eval/, ...), and training keeps its checkpoints beside Snakemake's outputs, one
folder per training spec (`.eaglenest/train/<spec>`), as hybrid mode keeps its samples. So the
run's disk by stage is the size of its folders: the top-level entries, with `.eaglenest/` and
`variants/` split one level further (each training spec, each sweep variant). A file linked from
two places (hybrid's kept samples and the trainer's cache) is counted once, where it is met
first, the sample store (its links to the shards' files) last; a symbolic link (the trainer's
data folder links the shards) is not followed.
"""

from __future__ import annotations

import os
from pathlib import Path

from eaglenest.core.errors import EaglenestError
from eaglenest.core.io import human_bytes
from eaglenest.hidden_states.store import STORE_DIR

# Folders whose entries are reported one by one: what each training spec and variant holds.
SPLIT = (".eaglenest", ".eaglenest/train", "variants")


def _entries(run_dir: Path) -> list[Path]:
    """The run's entries as reported: top level, with the SPLIT folders opened."""
    entries, todo = [], sorted(run_dir.iterdir())
    while todo:
        entry = todo.pop(0)
        rel = entry.relative_to(run_dir).as_posix()
        if rel in SPLIT and entry.is_dir() and not entry.is_symlink():
            todo = sorted(entry.iterdir()) + todo
        else:
            entries.append(entry)
    return entries


def folder_usage(run_dir) -> list[dict]:
    """One row per reported entry: `path` (relative to the run folder), `bytes`, `files`;
    largest first."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise EaglenestError("not a run folder (no such directory)", run_dir)
    seen: set[tuple[int, int]] = set()
    rows = []
    # The sample store links the shards' files: it is met last, so its row holds only what no
    # shard holds.
    for entry in sorted(_entries(run_dir), key=lambda e: e.relative_to(run_dir).as_posix() == STORE_DIR):
        size = files = 0
        walk = (
            os.walk(entry)
            if entry.is_dir() and not entry.is_symlink()
            else [(entry.parent, [], [entry.name])]
        )
        for folder, _dirs, names in walk:
            for name in names:
                st = os.lstat(os.path.join(folder, name))
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
                size += st.st_size
                files += 1
        rows.append({"path": entry.relative_to(run_dir).as_posix(), "bytes": size, "files": files})
    return sorted(rows, key=lambda r: (-r["bytes"], r["path"]))


def format_usage(rows: list[dict], run_dir) -> str:
    total = sum(r["bytes"] for r in rows)
    width = max([len(r["path"]) for r in rows] + [5])
    lines = [f"{run_dir}: {human_bytes(total)} in {sum(r['files'] for r in rows)} files"]
    lines += [f"  {r['path']:<{width}} {human_bytes(r['bytes']):>10} {r['files']:>8} files" for r in rows]
    return "\n".join(lines)
