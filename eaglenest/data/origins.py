"""Where a training answer comes from: the target, which regenerates it (`target`), or the prompt
source, which ships it (`dataset`). A source's `responses` key chooses; prepare_prompts marks its
rows, regenerate_responses sends only the `target` ones, and tokenize counts both. Its own module,
so that none of those stages reaches another's code (and reruns when that code changes)."""

from __future__ import annotations

TARGET = "target"
DATASET = "dataset"
RESPONSE_ORIGINS = (TARGET, DATASET)


def response_origin(row: dict) -> str:
    """A prompt's or a response's origin: rows without the field (all written before the field
    existed) are the target's."""
    return row.get("responses") or TARGET
