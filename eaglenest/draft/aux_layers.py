"""The target layers a draft reads (`hidden_states.aux_layer_ids`), chosen and checked.

Its own module, apart from the draft's config: extraction stores these layers, so it imports
this and nothing of the drafters, and a change to how a drafter is configured does not rerun
extraction.
"""

from __future__ import annotations

from eaglenest.core.errors import EaglenestError


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """EAGLE-3's usual choice: an early, a middle and a late layer."""
    return [2, num_layers // 2, num_layers - 3]


def resolve_aux_layer_ids(configured, num_layers: int, source="config") -> list[int]:
    ids = list(configured) if configured else default_aux_layer_ids(num_layers)
    if len(ids) != 3:
        raise EaglenestError(f"aux_layer_ids must name 3 layers, got {ids}", source)
    if len(set(ids)) != len(ids):
        raise EaglenestError(f"aux_layer_ids {ids} has duplicates (target has {num_layers} layers)", source)
    bad = [i for i in ids if not 0 <= i < num_layers]
    if bad:
        raise EaglenestError(f"aux_layer_ids {bad} outside the target's layers 0..{num_layers - 1}", source)
    return ids
