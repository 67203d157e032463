"""The floor of the comparison: the trained draft's shape with fresh weights.

Whatever an untrained draft accepts comes from its frozen parts (the target's embeddings, the
vocabulary mapping) and from chance; the trained draft's gain over it is what training bought.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from eaglenest.core.io import atomic_path
from eaglenest.draft.algorithms import folder_algorithm, trains_embeddings


def make_untrained_draft(trained_dir, out_dir, target_dir, seed: int = 0) -> Path:
    """The floor: the trained checkpoint's config, vocabulary mapping and the target's own
    embeddings with fresh trainable weights. EAGLE-3 keeps the target's embeddings frozen, so
    the checkpoint's are the target's; P-EAGLE trains them, so they are read back from the
    target (`target_dir`) with speculators' own loader, the one its training starts from. DFlash
    saves no embedding, and its head is the target's own rows, frozen, so that is kept too."""

    # torch here only: the workflow imports this module for METHODS when it plans, and torch
    # would add a second to every Snakemake call.
    import torch
    from safetensors.torch import load_file, save_file

    with atomic_path(out_dir, is_dir=True) as tmp:
        for f in Path(trained_dir).iterdir():
            if f.suffix == ".json" and f.name == "config.json":
                shutil.copy(f, tmp / f.name)
        gen = torch.Generator().manual_seed(seed)
        weights = load_file(str(Path(trained_dir) / "model.safetensors"))
        fresh = {}
        algorithm = folder_algorithm(trained_dir)
        frozen = ("d2t", "t2d", "lm_head.weight") if algorithm == "dflash" else ("d2t", "t2d")
        for name, w in weights.items():
            if name in frozen or "embed_tokens" in name or not w.is_floating_point():
                fresh[name] = w
            elif "norm" in name:
                fresh[name] = torch.ones_like(w)
            else:
                fresh[name] = (torch.randn(w.shape, generator=gen) * 0.02).to(w.dtype)
        if trains_embeddings(algorithm):
            from speculators.utils.loading import load_model_layers

            embed = load_model_layers(["embed_tokens.weight"], str(target_dir))["embed_tokens.weight"]
            fresh["embed_tokens.weight"] = embed.to(weights["embed_tokens.weight"].dtype)
        save_file(fresh, str(tmp / "model.safetensors"))
    return Path(out_dir)
