"""The mask token of a parallel drafter (P-EAGLE): the input id of the slots it fills in one pass.

The draft embeds that id at every masked slot, and training moves its (trained) embedding, so it
must be an id the target does not write: a token among the draft vocabulary's most frequent
ones would have its embedding pulled between two meanings. Resolved once, in draft_config, from
tokenize's counts (so a parallel draft's config waits for tokenize, where EAGLE-3's is written
at the start), and passed to the trainer explicitly, so speculators never picks another (its
own fallback is the pad, eos or unk token, whichever exists, with a warning).
"""

from __future__ import annotations

import numpy as np

from eaglenest.core.errors import EaglenestError


def mask_token_candidates(tokenizer, vocab_size: int) -> list[tuple[int, str]]:
    """What an unset `draft.mask_token_id` resolves to, in order: the tokenizer's mask token,
    the first embedding row no token uses (the id speculators gives the `<|MASK|>` it adds when
    there is room), then the pad and unk tokens. (id, where it came from) pairs."""
    found = []
    if tokenizer.mask_token_id is not None:
        found.append((int(tokenizer.mask_token_id), "the tokenizer's mask token"))
    if len(tokenizer) < vocab_size:
        found.append(
            (len(tokenizer), f"the first unused embedding row ({len(tokenizer)} tokens, {vocab_size} rows)")
        )
    for name in ("pad", "unk"):
        token_id = getattr(tokenizer, f"{name}_token_id")
        if token_id is not None:
            found.append((int(token_id), f"the tokenizer's {name} token"))
    return found


def frequency_problem(token_id: int, counts: np.ndarray, draft_vocab_size: int) -> str | None:
    """Why `token_id` cannot be the mask token given the trained tokens' `counts`, or None."""
    if not 0 <= token_id < counts.size:
        return f"id {token_id} is outside the target's vocabulary (0..{counts.size - 1})"
    count = int(counts[token_id])
    rank = int(np.count_nonzero(counts > count))  # ids written more often than it
    if count > 0 and rank < draft_vocab_size:
        return (
            f"id {token_id} is an answer token the target writes ({count} times, rank {rank + 1} by "
            f"frequency), inside the draft vocabulary's {draft_vocab_size}"
        )
    return None


def resolve_mask_token_id(configured, tokenizer, counts, draft_vocab_size: int, source=None) -> dict:
    """The run's mask token: {id, source}. `configured` (draft.mask_token_id) is checked as it
    is; unset, the first of mask_token_candidates that passes. Refused, naming `source`, when
    none does."""
    if configured is not None:
        problem = frequency_problem(int(configured), counts, draft_vocab_size)
        if problem:
            raise EaglenestError(
                f"draft.mask_token_id: {problem}: choose an id the target never writes", source
            )
        return {"id": int(configured), "source": "draft.mask_token_id"}
    tried = []
    for token_id, where in mask_token_candidates(tokenizer, counts.size):
        problem = frequency_problem(token_id, counts, draft_vocab_size)
        if problem is None:
            return {"id": token_id, "source": where}
        tried.append(f"{where}: {problem}")
    raise EaglenestError(
        "no mask token for the parallel draft: "
        + (
            "; ".join(tried)
            if tried
            else "the tokenizer has no mask, pad or unk token and no unused embedding row"
        )
        + ". Set draft.mask_token_id to an id the target never writes",
        source,
    )
