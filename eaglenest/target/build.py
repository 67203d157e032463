"""The `build_tiny_target` rule: build the configured stand-in target.

The tiny Llama (eaglenest.target.tiny) goes into its folder; the Kimi-K2.5 miniature
(eaglenest.target.kimi_mini, which reuses the tiny Llama's corpus reader) is published into the
hub cache. Choosing between them here keeps the two builders free of each other's imports.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from eaglenest.core.errors import EaglenestError
from eaglenest.target.kimi_mini import build_kimi_mini
from eaglenest.target.resolve import check_build_destination, hub_cache_dir, publish_to_hub_cache
from eaglenest.target.tiny import build_tiny_target

log = logging.getLogger(__name__)


def build_stage(*, target: str, cache_dir, corpus, shape: dict, tool_corpus=()) -> None:
    """The `build_tiny_target` rule: the tiny Llama into its folder, or the Kimi-K2.5
    miniature published into the hub cache under its hub id (as a download would leave it), so
    the workflow then resolves it exactly as it resolves `moonshotai/Kimi-K2.5`."""
    shape = dict(shape)
    architecture = shape.pop("architecture", "llama")
    if architecture == "llama":
        if tool_corpus:
            raise EaglenestError("target.build_tiny.tool_corpus applies to the kimi_k25 architecture only")
        build_tiny_target(target, [corpus], **shape)
        return
    if "intermediate_size" in shape:
        raise EaglenestError(
            "target.build_tiny.intermediate_size applies to the llama "
            "architecture only (kimi_k25 derives its MLP sizes)"
        )
    if "vocab_size" in shape:  # the BPE part; Kimi keeps 256 special ids after it
        shape["bpe_vocab_size"] = shape.pop("vocab_size")
    check_build_destination(target, "kimi_k25", cache_dir)
    cache = hub_cache_dir(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".build-") as tmp:
        folder = build_kimi_mini(Path(tmp) / "model", [corpus], tool_files=list(tool_corpus), **shape)
        commit = publish_to_hub_cache(folder, target, cache_dir)
    log.info("published %s at commit %s into %s", target, commit, cache)
