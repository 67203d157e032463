"""The `tokenize` stage: render regenerated conversations with the target's own chat template.

Each conversation from `raw_responses.jsonl` is rendered with the target tokenizer's chat template
(`apply_chat_template(..., tokenize=False)`), tokenized with the target's tokenizer, and given a loss
mask that is 1 exactly on the tokens the assistant produced: its reasoning block (if rendered),
its content and the end-of-turn token(s) that close its turn. Everything else -- BOS, system and
user turns, role headers such as ``<|im_start|>assistant\\n`` -- is 0.

How the mask is found, for any template and without per-template code: the text where assistant
turn ``i`` starts is the render of ``messages[:i]`` with ``add_generation_prompt=True`` (everything
up to where the model would start writing), and the text where it ends is the render of
``messages[:i + 1]``. When both are real prefixes of the full render, their lengths give the
turn's character span; trailing whitespace after the end-of-turn token (the ``\\n`` after
``<|im_end|>``) is left out. Character spans become token spans: a token is masked when its
first character lies in a span. A fast tokenizer gives each token's characters (offsets); a
slow or remote-code one (Kimi's tiktoken tokenizer) gives none, so there a span boundary is the
length of the tokenization of the text before it (`token_index_at`), which the tests prove
equal to the offsets on fast tokenizers.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from pathlib import Path

import numpy as np

from eaglenest.errors import EaglenestError
from eaglenest.io import atomic_path, iter_jsonl
from eaglenest.target import load_tokenizer, read_shape

ROLES = ("system", "user", "assistant")
SKIP_REASONS = ("regeneration_failed", "overlong", "no_assistant_tokens")
OVERLONG_POLICIES = ("truncate", "drop")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

# How reasoning_content reaches the rendered text.
REASONING_TEMPLATE = "template"  # the template references reasoning_content and renders it
REASONING_INLINE = "inline"  # we prepend <think>\n...\n</think>\n\n to the content ourselves
REASONING_DROPPED = "dropped"  # neither: the reasoning is left out (and counted)

log = logging.getLogger(__name__)

_CHUNK_ROWS = 256  # rows rendered and tokenized per batch


# --------------------------------------------------------------------------------------------
# Target model: tokenizer, config vocab size, template
# --------------------------------------------------------------------------------------------


def chat_template_text(tokenizer) -> str:
    """The chat template the tokenizer renders with by default."""
    try:
        template = tokenizer.get_chat_template()
    except Exception as e:
        raise EaglenestError(f"the tokenizer has no usable chat template: {e}") from None
    if not isinstance(template, str) or not template.strip():
        raise EaglenestError("the tokenizer has no chat template")
    return template


def chat_template_hash(tokenizer) -> str:
    """sha256 (hex) of the chat template text, to tie the data to the template that made it."""
    return hashlib.sha256(chat_template_text(tokenizer).encode("utf-8")).hexdigest()


def reasoning_mode(tokenizer) -> str:
    """How reasoning is rendered: by the template, inlined with <think> tokens, or dropped."""
    if "reasoning_content" in chat_template_text(tokenizer):
        return REASONING_TEMPLATE
    vocab = tokenizer.get_vocab()
    if THINK_OPEN in vocab and THINK_CLOSE in vocab:
        return REASONING_INLINE
    return REASONING_DROPPED


# --------------------------------------------------------------------------------------------
# Input rows -> template messages
# --------------------------------------------------------------------------------------------


def _where(rid, recno: int) -> str:
    return f"record {recno} (id {rid!r})" if rid is not None else f"record {recno}"


def prepare_messages(row: dict, mode: str, path=None, recno: int = 0):
    """Validate one response row and build the messages handed to the template.

    Returns ``(messages, n_reasoning, n_dropped)`` or ``None`` for a failed request (an
    ``error`` row with no messages). Raises EaglenestError for a malformed conversation.
    """
    rid = row.get("id")
    where = _where(rid, recno)
    if not isinstance(rid, str) or not rid:
        raise EaglenestError(f"{where}: missing or non-string 'id'", path)
    messages = row.get("messages")
    if messages is None:
        if "error" in row:
            return None
        raise EaglenestError(f"{where}: has neither 'messages' nor 'error'", path)
    if not isinstance(messages, list):
        raise EaglenestError(f"{where}: 'messages' must be a list", path)
    if not messages:
        raise EaglenestError(f"{where}: empty conversation (no messages)", path)

    out = []
    n_reasoning = n_dropped = 0
    for j, m in enumerate(messages):
        if not isinstance(m, dict):
            raise EaglenestError(f"{where}: message {j} is not an object", path)
        role = m.get("role")
        if role not in ROLES:
            raise EaglenestError(
                f"{where}: message {j} has unknown role {role!r} (expected one of {', '.join(ROLES)})",
                path,
            )
        content = m.get("content")
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise EaglenestError(f"{where}: message {j} content must be a string", path)
        msg = {"role": role, "content": content}
        reasoning = m.get("reasoning_content")
        if reasoning is not None and not isinstance(reasoning, str):
            raise EaglenestError(f"{where}: message {j} reasoning_content must be a string or null", path)
        if role == "assistant" and reasoning and reasoning.strip():
            n_reasoning += 1
            if mode == REASONING_TEMPLATE:
                msg["reasoning_content"] = reasoning
            elif mode == REASONING_INLINE:
                msg["content"] = (
                    f"{THINK_OPEN}\n{reasoning.strip(chr(10))}\n{THINK_CLOSE}\n\n{content.lstrip(chr(10))}"
                )
            else:
                n_dropped += 1
        out.append(msg)

    if not any(m["role"] == "assistant" for m in out):
        raise EaglenestError(f"{where}: no assistant turn", path)
    if out[-1]["role"] != "assistant":
        raise EaglenestError(f"{where}: the last message must be the assistant response", path)
    return out, n_reasoning, n_dropped


# --------------------------------------------------------------------------------------------
# Rendering and masks
# --------------------------------------------------------------------------------------------


def _render(tokenizer, conversations: list[list[dict]], add_generation_prompt: bool) -> list:
    """Render many conversations in one call; an item whose render fails comes back as the
    exception it raised (found by re-rendering one by one only when the batch call fails)."""
    if not conversations:
        return []
    try:
        return list(
            tokenizer.apply_chat_template(
                conversations, tokenize=False, add_generation_prompt=add_generation_prompt
            )
        )
    except Exception:
        pass
    out = []
    for conv in conversations:
        try:
            # Always passed as a batch of one, so an empty prefix ([]) reaches the template.
            out.append(
                tokenizer.apply_chat_template([conv], tokenize=False, add_generation_prompt=add_generation_prompt)[0]
            )
        except Exception as e:
            out.append(e)
    return out


def _common_prefix_len(a: str, b: str) -> int:
    # Binary search on slice equality: C-speed comparisons instead of a Python loop per char.
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def assistant_char_spans(
    full: str,
    messages: list[dict],
    start_renders: list,
    end_renders: list,
) -> tuple[list[tuple[int, int]], int]:
    """Character spans ``[start, end)`` of the assistant turns in the full render.

    `start_renders[k]` is the render of ``messages[:i]`` with add_generation_prompt=True and
    `end_renders[k]` that of ``messages[:i + 1]`` (None for the final turn, whose end is the end
    of `full`), for the k-th assistant message ``i``; a failed render is an Exception.

    The prefix property (a prefix render is a prefix of the full render) holds for most templates
    but not all: Qwen3's template renders the reasoning of an assistant turn only when it comes
    after the last user message, so ``messages[:i + 1]`` shows turn ``i``'s <think> block (or an
    empty one) while the full render, where later user turns follow, does not. Then the turn's end
    is found by anchoring on its content: the text that follows the content in the prefix render
    (e.g. ``<|im_end|>\\n``) must follow the same content in the full render, after the turn's
    start and before the next assistant turn's start. A non-final turn whose span cannot be
    established this way is left unmasked (and counted); the final turn -- the target's own
    response -- is always masked, starting at the longest common prefix of its generation-prompt
    render and the full render if the prefix property fails there.

    Returns ``(spans, n_unmasked_turns)``.
    """
    assistant_idx = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    last = len(messages) - 1
    n = len(full)

    starts: list[int | None] = []
    for k, i in enumerate(assistant_idx):
        s = start_renders[k]
        if isinstance(s, str) and full.startswith(s):
            starts.append(len(s))
        elif i == last:
            if not isinstance(s, str):
                raise EaglenestError(
                    f"the chat template cannot render the generation prompt for the final turn: {s}"
                )
            starts.append(_common_prefix_len(s, full))
        else:
            starts.append(None)

    spans: list[tuple[int, int]] = []
    unmasked = 0
    floor = 0  # spans must not overlap and must come in order
    for k, i in enumerate(assistant_idx):
        start = starts[k]
        if start is None or start < floor:
            if i != last:
                unmasked += 1
                continue
            start = max(start or 0, floor)
        anchor = messages[i]["content"].strip()
        if i == last:
            end = n
        else:
            bound = next((s for s in starts[k + 1 :] if s is not None), n)
            e_text = end_renders[k]
            end = None
            if isinstance(e_text, str) and full.startswith(e_text):
                end = len(e_text)
            elif isinstance(e_text, str) and anchor:
                j = e_text.rfind(anchor)
                p = full.find(anchor, start, bound)
                if j >= 0 and p >= 0:
                    suffix = e_text[j + len(anchor) :]
                    if full.startswith(suffix, p + len(anchor)):
                        end = p + len(anchor) + len(suffix)
            if end is None or end > bound or end <= start:
                unmasked += 1
                continue
        # Leave out whitespace after the end-of-turn token (the "\n" after <|im_end|>), never
        # cutting into the content itself.
        c = full.rfind(anchor, start, end) if anchor else -1
        content_end = c + len(anchor) if c >= 0 else start
        while end > content_end and full[end - 1].isspace():
            end -= 1
        if end > start:
            spans.append((start, end))
            floor = end
        elif i != last:
            unmasked += 1
    return spans, unmasked


def assistant_mask(offsets, spans) -> np.ndarray:
    """Token loss mask (uint8) from token character offsets and assistant character spans:
    a token is masked when its first character lies in a span."""
    if len(offsets) == 0:
        return np.zeros(0, dtype=np.uint8)
    starts = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)[:, 0]
    mask = np.zeros(len(starts), dtype=bool)
    for s, e in spans:
        mask |= (starts >= s) & (starts < e)
    return mask.astype(np.uint8)


def _first_token_from(encoding, pos: int, n_tokens: int, n_chars: int):
    """Index of the first token whose first character is at or after `pos` (None: unsure)."""
    if pos >= n_chars:
        return n_tokens
    t = encoding.char_to_token(pos)
    if t is None:
        return None
    start = encoding.token_to_chars(t)[0]
    return t if start >= pos else t + 1


def encoding_mask(encoding, spans, n_chars: int) -> np.ndarray:
    """`assistant_mask` for a tokenizers Encoding, without materializing every offset: the span
    boundaries are looked up with char_to_token, falling back to the offsets when a boundary
    character belongs to no token."""
    n = len(encoding.ids)
    mask = np.zeros(n, dtype=np.uint8)
    for s, e in spans:
        a = _first_token_from(encoding, s, n, n_chars)
        b = _first_token_from(encoding, e, n, n_chars)
        if a is None or b is None:
            return assistant_mask(encoding.offsets, spans)
        mask[a:b] = 1
    return mask


def encode_conversations(tokenizer, conversations: list[list[dict]], names=None,
                         force_prefix_boundaries: bool = False) -> list[dict]:
    """Render, tokenize and mask template-ready conversations (each ends with an assistant turn).

    Returns one dict per conversation: ``input_ids`` (int64 array), ``loss_mask`` (uint8 array),
    ``text`` (the full render), ``spans`` (assistant char spans) and ``unmasked_turns``.
    `force_prefix_boundaries` takes the no-offsets path on a fast tokenizer (to test it).
    """
    names = names if names is not None else [None] * len(conversations)
    fulls = _render(tokenizer, conversations, add_generation_prompt=False)
    start_jobs, end_jobs, owners = [], [], []
    for ci, msgs in enumerate(conversations):
        for i, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            owners.append(ci)
            start_jobs.append(msgs[:i])
            end_jobs.append(msgs[: i + 1] if i != len(msgs) - 1 else None)
    starts = _render(tokenizer, start_jobs, add_generation_prompt=True)
    end_idx = [j for j, e in enumerate(end_jobs) if e is not None]
    ends_rendered = _render(tokenizer, [end_jobs[j] for j in end_idx], add_generation_prompt=False)
    ends: list = [None] * len(end_jobs)
    for j, r in zip(end_idx, ends_rendered):
        ends[j] = r

    per_conv_starts: list[list] = [[] for _ in conversations]
    per_conv_ends: list[list] = [[] for _ in conversations]
    for j, ci in enumerate(owners):
        per_conv_starts[ci].append(starts[j])
        per_conv_ends[ci].append(ends[j])

    spans_all = []
    for ci, msgs in enumerate(conversations):
        full = fulls[ci]
        if not isinstance(full, str):
            raise EaglenestError(f"{_name(names[ci])}the chat template failed to render: {full}")
        try:
            spans_all.append(assistant_char_spans(full, msgs, per_conv_starts[ci], per_conv_ends[ci]))
        except EaglenestError as e:
            raise EaglenestError(f"{_name(names[ci])}{e.problem}") from None

    enc = tokenizer(
        fulls,
        add_special_tokens=False,  # the template already holds BOS etc., as apply_chat_template
        return_attention_mask=False,
        return_token_type_ids=False,
        verbose=False,
    )
    use_offsets = getattr(tokenizer, "is_fast", False) and not force_prefix_boundaries
    results = []
    for ci, full in enumerate(fulls):
        spans, unmasked = spans_all[ci]
        if use_offsets:
            e = enc.encodings[ci]
            ids = np.asarray(e.ids, dtype=np.int64)
            mask = encoding_mask(e, spans, len(full))
        else:
            ids = np.asarray(enc["input_ids"][ci], dtype=np.int64)
            mask = prefix_mask(tokenizer, full, ids, spans)
        results.append({"input_ids": ids, "loss_mask": mask, "text": full, "spans": spans,
                        "unmasked_turns": unmasked})
    return results


def token_index_at(tokenizer, text: str, ids, pos: int) -> int:
    """Index of the first token of `ids` (the tokenization of `text`) that starts at or after
    character `pos`, without character offsets.

    Where the tokenization of ``text[:pos]`` is a prefix of `ids` (a boundary at a special token
    or between pre-tokenizer words: the usual case at a turn boundary), its length is the
    answer. Where a token straddles `pos`, the answer is the first token whose decoded prefix
    reaches `pos` (binary search on decoded lengths)."""
    n = len(ids)
    if pos <= 0:
        return 0
    if pos >= len(text):
        return n
    prefix = tokenizer(text[:pos], add_special_tokens=False)["input_ids"]
    if len(prefix) <= n and np.array_equal(ids[: len(prefix)], prefix):
        return len(prefix)
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        decoded = tokenizer.decode(ids[:mid].tolist(), skip_special_tokens=False,
                                   clean_up_tokenization_spaces=False)
        if len(decoded) >= pos:
            hi = mid
        else:
            lo = mid + 1
    return lo


def prefix_mask(tokenizer, text: str, ids: np.ndarray, spans) -> np.ndarray:
    """`assistant_mask` for a tokenizer without offsets (see `token_index_at`)."""
    mask = np.zeros(len(ids), dtype=np.uint8)
    for s, e in spans:
        mask[token_index_at(tokenizer, text, ids, s):token_index_at(tokenizer, text, ids, e)] = 1
    return mask


def _name(rid) -> str:
    return f"id {rid!r}: " if rid is not None else ""


# --------------------------------------------------------------------------------------------
# The stage
# --------------------------------------------------------------------------------------------


def tokenize_responses(
    responses_path,
    target_dir,
    max_seq_len: int,
    overlong: str,
    out_data,
    out_freq,
    out_metadata,
    target_name: str = "",
    target_revision: str | None = None,
    trust_remote_code: bool = False,
) -> dict:
    """Tokenize `raw_responses.jsonl` for draft training; write data, token counts, metadata.

    `target_dir` is the target model folder (tokenizer files, chat template and config.json);
    its tokenizer is loaded as it ships (remote code with `trust_remote_code`).
    Outputs appear only if the whole run succeeds. Returns the metadata dict.
    """
    import torch

    responses_path = Path(responses_path)
    if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or max_seq_len < 1:
        raise EaglenestError(f"max_seq_len must be a positive integer (got {max_seq_len!r})")
    if overlong not in OVERLONG_POLICIES:
        raise EaglenestError(f"overlong must be one of {OVERLONG_POLICIES} (got {overlong!r})")
    if not responses_path.exists():
        raise EaglenestError("file does not exist", responses_path)

    tokenizer = load_tokenizer(target_dir, trust_remote_code)
    vocab_size = read_shape(target_dir, require=("vocab_size",)).vocab_size
    tok_vocab = len(tokenizer)
    template_hash = chat_template_hash(tokenizer)
    mode = reasoning_mode(tokenizer)

    counts = np.zeros(vocab_size, dtype=np.int64)
    skipped = dict.fromkeys(SKIP_REASONS, 0)
    stats = dict(
        samples_in=0, samples_out=0, truncated=0, tokens_total=0, tokens_loss_masked=0,
        turns_reasoning=0, turns_reasoning_dropped=0, turns_assistant=0, turns_unmasked=0,
        rows_served_ids=0,
    )  # fmt: skip

    def flush(batch, f):
        if not batch:
            return
        rids = [rid for rid, _, _ in batch]
        convs = [msgs for _, msgs, _ in batch]
        rendered = [i for i, (_, _, served) in enumerate(batch) if served is None]
        try:
            encoded_rendered = encode_conversations(
                tokenizer, [convs[i] for i in rendered], names=[rids[i] for i in rendered]
            ) if rendered else []
        except EaglenestError as e:
            if e.path is not None:
                raise
            raise EaglenestError(e.problem, responses_path) from None
        encoded = [None] * len(batch)
        for i, r in zip(rendered, encoded_rendered):
            encoded[i] = r
        for i, (rid, msgs, served) in enumerate(batch):
            if served is not None:
                encoded[i] = encode_served(tokenizer, rid, msgs, served, responses_path)
                stats["rows_served_ids"] += 1
        masked_chunks = []
        lines = []
        for rid, msgs, r in zip(rids, convs, encoded):
            ids, mask = r["input_ids"], r["loss_mask"]
            stats["turns_assistant"] += sum(m["role"] == "assistant" for m in msgs)
            stats["turns_unmasked"] += r["unmasked_turns"]
            if ids.size:
                top = int(ids.max())
                if top >= tok_vocab:
                    raise EaglenestError(
                        f"id {rid!r}: token id {top} is outside the tokenizer vocab (size {tok_vocab})",
                        responses_path,
                    )
                if top >= vocab_size:
                    raise EaglenestError(
                        f"id {rid!r}: token id {top} is outside the target's vocab "
                        f"(its config's vocab_size {vocab_size})",
                        responses_path,
                    )
            was_truncated = False
            if ids.size > max_seq_len:
                if overlong == "drop":
                    skipped["overlong"] += 1
                    continue
                ids, mask = ids[:max_seq_len], mask[:max_seq_len]
                was_truncated = True
            n_masked = int(mask.sum())
            if n_masked == 0:
                skipped["no_assistant_tokens"] += 1
                continue
            stats["truncated"] += was_truncated
            stats["samples_out"] += 1
            stats["tokens_total"] += int(ids.size)
            stats["tokens_loss_masked"] += n_masked
            masked_chunks.append(ids[mask.astype(bool)])
            lines.append(
                '{"id":%s,"input_ids":%s,"loss_mask":%s}\n'
                % (json.dumps(rid, ensure_ascii=False), _int_list(ids), _bit_list(mask))
            )
        if masked_chunks:
            counts[:] += np.bincount(np.concatenate(masked_chunks), minlength=vocab_size)
        f.write("".join(lines))
        batch.clear()

    with contextlib.ExitStack() as stack:
        tmp_meta = stack.enter_context(atomic_path(out_metadata))
        tmp_freq = stack.enter_context(atomic_path(out_freq))
        tmp_data = stack.enter_context(atomic_path(out_data))
        with open(tmp_data, "w", encoding="utf-8") as f:
            batch: list = []
            for recno, row in enumerate(iter_jsonl(responses_path), start=1):
                stats["samples_in"] += 1
                prepared = prepare_messages(row, mode, responses_path, recno)
                if prepared is None:
                    skipped["regeneration_failed"] += 1
                    continue
                msgs, n_reasoning, n_dropped = prepared
                stats["turns_reasoning"] += n_reasoning
                stats["turns_reasoning_dropped"] += n_dropped
                batch.append((row["id"], msgs, served_token_ids(row)))
                if len(batch) >= _CHUNK_ROWS:
                    flush(batch, f)
            flush(batch, f)

        torch.save(torch.from_numpy(counts), tmp_freq)

        assert stats["samples_in"] == stats["samples_out"] + sum(skipped.values())
        metadata = {
            "samples_in": stats["samples_in"],
            "samples_out": stats["samples_out"],
            "skipped": skipped,
            "truncated": stats["truncated"],
            "tokens_total": stats["tokens_total"],
            "tokens_loss_masked": stats["tokens_loss_masked"],
            "max_seq_len": max_seq_len,
            "overlong": overlong,
            "chat_template_hash": template_hash,
            "target_name": target_name,
            "target_revision": target_revision,
            "tokenizer_vocab_size": tok_vocab,
            "target_vocab_size": vocab_size,
            "reasoning": {
                "mode": mode,
                "assistant_turns_with_reasoning": stats["turns_reasoning"],
                "assistant_turns_reasoning_dropped": stats["turns_reasoning_dropped"],
            },
            "assistant_turns": {
                "total": stats["turns_assistant"],
                "unmasked": stats["turns_unmasked"],
            },
            "mask_method": {
                "served_token_ids": stats["rows_served_ids"],
                "template_render": stats["samples_in"] - skipped["regeneration_failed"]
                - stats["rows_served_ids"],
            },
        }
        tmp_meta.write_text(json.dumps(metadata, indent=2) + "\n")
    log.info(
        "tokenize: %d rows in, %d out, skipped %s, %d truncated; %d tokens, %d loss-masked; "
        "reasoning %s; %d of %d assistant turns unmasked",
        metadata["samples_in"], metadata["samples_out"], skipped, metadata["truncated"],
        metadata["tokens_total"], metadata["tokens_loss_masked"], mode,
        stats["turns_unmasked"], stats["turns_assistant"],
    )
    return metadata


def served_token_ids(row: dict):
    """The exact tokens the server fed and emitted, when regeneration recorded them."""
    prompt, completion = row.get("prompt_token_ids"), row.get("completion_token_ids")
    if prompt is None or completion is None:
        return None
    return prompt, completion


def encode_served(tokenizer, rid, msgs, served, path) -> dict:
    """Training tokens = what the target saw and emitted while regenerating.

    Re-tokenizing the response text can give other tokens than the ones the model emitted
    (non-canonical merges, partial UTF-8 bytes, reasoning markers), and then the draft learns
    a sequence the target never produces. So the answer's tokens are the served ones (loss 1,
    including the end-of-turn token the model emitted), after the prompt as the server rendered
    it (loss 0). The prompt is re-rendered here with the target's chat template and must match
    the server's tokens exactly: a template changed since regeneration is an error.
    """
    prompt_ids, completion_ids = served
    expected = tokenizer.apply_chat_template(msgs[:-1], tokenize=False, add_generation_prompt=True)
    expected_ids = tokenizer(expected, add_special_tokens=False)["input_ids"]
    if list(expected_ids) != list(prompt_ids):
        raise EaglenestError(
            f"id {rid!r}: the prompt as the target's chat template renders it now differs from "
            "the prompt the server rendered during regeneration (template or tokenizer changed "
            "since then?)", path)
    ids = np.asarray([*prompt_ids, *completion_ids], dtype=np.int64)
    mask = np.zeros(ids.size, dtype=np.int64)
    mask[len(prompt_ids):] = 1
    return {"input_ids": ids, "loss_mask": mask, "unmasked_turns": 0}


def _int_list(a: np.ndarray) -> str:
    # Same text as json.dumps(list_of_ints, separators=(",", ":")), without building Python ints
    # one by one through the JSON encoder.
    return "[" + ",".join(map(str, a.tolist())) + "]"


def _bit_list(mask: np.ndarray) -> str:
    # A 0/1 array as "[0,1,...]", built as bytes: digits at even places, commas between.
    if mask.size == 0:
        return "[]"
    buf = np.full(2 * mask.size - 1, ord(","), dtype=np.uint8)
    buf[::2] = mask.astype(np.uint8) + ord("0")
    return "[" + buf.tobytes().decode("ascii") + "]"


__all__ = [
    "encode_served",
    "served_token_ids",
    "assistant_char_spans",
    "assistant_mask",
    "chat_template_hash",
    "chat_template_text",
    "encode_conversations",
    "encoding_mask",
    "prepare_messages",
    "reasoning_mode",
    "tokenize_responses",
]
