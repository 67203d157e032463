"""Checks between stages: a silently wrong artifact is worse than a crash.

Each check names both files that disagree, so the user knows which stage to rerun.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from eaglenest.core.errors import EaglenestError
from eaglenest.core.io import read_json


def check_training_inputs(draft_config_path, shard_dirs, t2d_npy, d2t_npy) -> dict:
    """The draft config, the hidden states and the vocabulary mapping must agree.

    `shard_dirs`: the shards (their manifest.json), or, where training extracts as it goes,
    the hidden-state plan (plan.json), which names the layers and hidden size it will extract.
    Returns what was checked and found consistent (for the log)."""
    dcfg = read_json(draft_config_path)["eaglenest"]
    shard_dirs = list(shard_dirs)
    for shard in shard_dirs:
        manifest_path = Path(shard) / "manifest.json" if Path(shard).is_dir() else Path(shard)
        manifest = read_json(manifest_path)
        if manifest["aux_layer_ids"] != dcfg["aux_layer_ids"]:
            raise EaglenestError(
                f"hidden states from layers {manifest['aux_layer_ids']} but {draft_config_path} "
                f"expects {dcfg['aux_layer_ids']}",
                manifest_path,
            )
        if manifest["hidden_size"] != dcfg["hidden_size"]:
            raise EaglenestError(
                f"hidden size {manifest['hidden_size']} differs from {dcfg['hidden_size']} in "
                f"{draft_config_path}",
                manifest_path,
            )
    t2d, d2t = np.load(t2d_npy), np.load(d2t_npy)
    if t2d.shape != (dcfg["target_vocab_size"],):
        raise EaglenestError(
            f"t2d covers {t2d.shape[0]} target ids but {draft_config_path} says "
            f"the target vocabulary has {dcfg['target_vocab_size']}",
            t2d_npy,
        )
    if not int(t2d.sum()) == len(d2t) == dcfg["draft_vocab_size"]:
        raise EaglenestError(
            f"t2d selects {int(t2d.sum())} ids, {d2t_npy} has {len(d2t)}, "
            f"{draft_config_path} expects {dcfg['draft_vocab_size']}",
            t2d_npy,
        )
    selected = np.flatnonzero(t2d)
    if not np.array_equal(np.arange(len(d2t)) + d2t, selected):
        raise EaglenestError(f"d2t offsets do not point at the ids t2d selects ({t2d_npy})", d2t_npy)
    return {
        "shards": len(shard_dirs),
        "aux_layer_ids": dcfg["aux_layer_ids"],
        "hidden_size": dcfg["hidden_size"],
        "target_vocab_size": dcfg["target_vocab_size"],
        "draft_vocab_size": dcfg["draft_vocab_size"],
    }
