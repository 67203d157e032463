"""Loss masks on the real chat templates of reasoning (and other) model families.

Each family's template is the model's own (tests/data/templates/real, SOURCES.md says where each
came from); its tokenizer is built here with the family's special tokens. The expected render and
mask come from `chat_families`, written by hand from reading each template, never from
eaglenest's code. Every check is token by token.
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import json

import numpy as np
import pytest
from chat_families import CASES, FAMILIES, Family, msg

from eaglenest.data.tokenize import tokenize_stage

CORPUS = [m["content"] + " " + (m.get("reasoning_content") or "") for conv in CASES.values() for m in conv]


def build_tokenizer(family: Family, folder):
    """A byte-level BPE tokenizer with the family's special tokens and template, saved with a
    config.json as a target folder."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=family.special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 3, trainer=trainer)
    if family.think_tokens:  # added, not special, as in Qwen3 and DeepSeek
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("<think>", "</think>")])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=family.bos, eos_token=family.eos)
    fast.chat_template = family.path.read_text(encoding="utf-8")
    fast.save_pretrained(folder)
    (folder / "config.json").write_text(
        json.dumps({"model_type": "llama", "vocab_size": 1024, "hidden_size": 64, "num_hidden_layers": 4})
    )
    return fast


@pytest.fixture(scope="module", params=FAMILIES, ids=[f.name for f in FAMILIES])
def family(request, tmp_path_factory):
    fam = request.param
    if not fam.path.exists():
        pytest.fail(f"missing template {fam.path}")
    folder = tmp_path_factory.mktemp(fam.name)
    return fam, build_tokenizer(fam, folder), folder


def expected_tokens(tokenizer, segments):
    """Ids and mask of the expected render: a token is masked when its first character lies in a
    masked segment."""
    text = "".join(t for t, _ in segments)
    char_mask = (
        np.concatenate([np.full(len(t), m, dtype=np.uint8) for t, m in segments])
        if text
        else np.zeros(0, dtype=np.uint8)
    )
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    starts = [s for s, _ in enc["offset_mapping"]]
    return text, np.asarray(enc["input_ids"]), char_mask[starts]


def test_expectations_match_the_real_templates(family):
    """The hand-written expectation is the template's own render (reasoning passed the way the
    family takes it, where the expectation says it is rendered)."""
    fam, tok, _ = family
    for name, conv in CASES.items():
        segments, fates = fam.expect(conv)
        turns = [i for i, m in enumerate(conv) if m["role"] == "assistant"]
        messages = []
        for i, m in enumerate(conv):
            out = {"role": m["role"], "content": m["content"]}
            if i in turns and fates[turns.index(i)] == "rendered":
                r = m["reasoning_content"]
                if fam.passed_as == "inline":
                    out["content"] = f"<think>\n{r}\n</think>\n\n{m['content']}"
                else:
                    out[fam.passed_as] = r
            messages.append(out)
        rendered = tok.apply_chat_template(messages, tokenize=False)
        assert rendered == "".join(t for t, _ in segments), f"{fam.name}/{name}"


def run_stage(tmp_path, folder, rows, multi_turn="all"):
    responses = tmp_path / "raw_responses.jsonl"
    responses.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "out"
    meta = tokenize_stage(
        responses,
        folder,
        4096,
        "truncate",
        out / "data.jsonl",
        out / "freq.pt",
        out / "metadata.json",
        multi_turn=multi_turn,
    )
    data = {r["id"]: r for r in map(json.loads, (out / "data.jsonl").read_text().splitlines())}
    return meta, data


def assert_tokens(tok, row, text, ids, mask, where):
    """A tokenized row is the expected render, token by token, and its mask the expected one
    (the first difference shown in context)."""
    assert tok.decode(row["input_ids"]) == text, where
    assert row["input_ids"] == ids.tolist(), where
    got = np.asarray(row["loss_mask"], dtype=np.uint8)
    if not np.array_equal(got, mask):
        bad = int(np.flatnonzero(got != mask)[0])
        raise AssertionError(
            f"{where}: mask differs at token {bad} "
            f"({tok.decode(ids[max(0, bad - 3) : bad + 3])!r}): "
            f"expected {mask[max(0, bad - 3) : bad + 3]}, got {got[max(0, bad - 3) : bad + 3]}"
        )


def assert_every_turn_masked(meta, n_turns, fates_seen, passed_as):
    """metadata.json counts every assistant turn masked and each reasoning's fate."""
    assert meta["assistant_turns"] == {
        "total": n_turns,
        "masked": n_turns,
        "unmasked": 0,
        "context_by_policy": 0,
    }
    assert meta["reasoning"]["assistant_turns_with_reasoning"] == sum(fates_seen.values())
    assert {k: meta["reasoning"][k] for k in fates_seen} == fates_seen
    assert meta["reasoning"]["passed_as"] == passed_as


def test_render_path_masks_every_turn_as_the_template_writes_it(family, tmp_path):
    fam, tok, folder = family
    meta, data = run_stage(tmp_path, folder, [{"id": n, "messages": c} for n, c in CASES.items()])
    n_turns = 0
    fates_seen = {"rendered": 0, "dropped_by_template": 0, "dropped_unsupported": 0}
    for name, conv in CASES.items():
        segments, fates = fam.expect(conv)  # opens_with_assistant too: every family masks it
        text, ids, mask = expected_tokens(tok, segments)
        assert_tokens(tok, data[name], text, ids, mask, f"{fam.name}/{name}")
        n_turns += len(fates)
        for f in fates:
            if f != "none":
                fates_seen[f] += 1
    assert_every_turn_masked(meta, n_turns, fates_seen, fam.passed_as)
    assert meta["samples_in"] + meta["rows_from_expansion"] == meta["samples_out"] + sum(
        meta["skipped"].values()
    )


def only_last_turn(segments):
    """The expectation with only the final assistant turn masked."""
    last = max(k for k, (_, m) in enumerate(segments) if m)
    return [(t, m if k == last else 0) for k, (t, m) in enumerate(segments)]


def assert_row(tok, fam, name, row, segments):
    _text, ids, mask = expected_tokens(tok, segments)
    assert row["input_ids"] == ids.tolist(), f"{fam.name}/{name}"
    got = np.asarray(row["loss_mask"], dtype=np.uint8)
    assert got.tolist() == mask.tolist(), f"{fam.name}/{name}: {tok.decode(ids[got.astype(bool)])!r}"


@pytest.mark.parametrize("policy", ["expand", "last"])
def test_one_turn_per_row_policies(family, tmp_path, policy):
    """`expand`: a row per assistant turn, each the final turn of its row, so its reasoning is
    rendered where the template keeps the last turn's; `last`: only the final turn is trained."""
    fam, tok, folder = family
    conv = CASES["multi"]
    meta, data = run_stage(tmp_path, folder, [{"id": "multi", "messages": conv}], multi_turn=policy)
    turns = [i for i, m in enumerate(conv) if m["role"] == "assistant"]
    if policy == "last":
        assert list(data) == ["multi"]
        assert_row(tok, fam, "multi", data["multi"], only_last_turn(fam.expect(conv)[0]))
        assert meta["assistant_turns"]["context_by_policy"] == len(turns) - 1
        return
    assert list(data) == ["multi#0", "multi#1", "multi"]
    fates = []
    for rid, i in zip(data, turns):
        segments, row_fates = fam.expect(conv[: i + 1])
        assert_row(tok, fam, rid, data[rid], only_last_turn(segments))
        fates.append(row_fates[-1])
    assert meta["rows_from_expansion"] == 2 and meta["samples_out"] == 3
    assert meta["assistant_turns"] == {"total": 3, "masked": 3, "unmasked": 0, "context_by_policy": 0}
    assert meta["reasoning"]["rendered"] == fates.count("rendered")


def test_served_ids_path_trains_earlier_turns_like_the_render_path(family, tmp_path):
    """A regenerated row (served prompt and completion ids) masks its earlier assistant turns as
    the render path does, and every emitted token."""
    fam, tok, folder = family
    # As prompts come from a dataset: earlier turns carry no reasoning.
    conv = [
        {k: v for k, v in m.items() if k != "reasoning_content" or i == len(CASES["multi"]) - 1}
        for i, m in enumerate(CASES["multi"])
    ]
    prompt_text = tok.apply_chat_template(conv[:-1], tokenize=False, add_generation_prompt=True)
    prompt_ids = tok(prompt_text, add_special_tokens=False)["input_ids"]
    completion_ids = tok("Madrid.", add_special_tokens=False)["input_ids"] + [
        tok.convert_tokens_to_ids(fam.eos)
    ]
    rows = [
        {"id": "rendered", "messages": conv},
        {
            "id": "served",
            "messages": conv,
            "prompt_token_ids": prompt_ids,
            "completion_token_ids": completion_ids,
        },
    ]
    meta, data = run_stage(tmp_path, folder, rows)
    served, rendered = data["served"], data["rendered"]
    assert served["input_ids"] == prompt_ids + completion_ids
    assert served["loss_mask"][len(prompt_ids) :] == [1] * len(completion_ids)
    # The earlier turns: the same tokens, the same mask, in both paths.
    common = (
        next(k for k, (a, b) in enumerate(zip(prompt_ids, rendered["input_ids"])) if a != b)
        if prompt_ids != rendered["input_ids"][: len(prompt_ids)]
        else len(prompt_ids)
    )
    earlier = max(k for k, m in enumerate(rendered["loss_mask"][:common]) if not m)  # before the last turn
    assert served["loss_mask"][:earlier] == rendered["loss_mask"][:earlier]
    assert sum(served["loss_mask"][:earlier]) > 0  # the two earlier answers are trained
    assert meta["mask_method"] == {"served_token_ids": 1, "template_render": 1}
    assert meta["assistant_turns"]["unmasked"] == 0 and meta["assistant_turns"]["total"] == 6


def test_reasoning_in_any_input_form_trains_the_same(tmp_path):
    """Reasoning may arrive as reasoning_content (vLLM), thinking (gpt-oss datasets), reasoning
    (newer vLLM) or inline in the content, with or without the opening tag (DeepSeek-R1 opens it
    in the prompt); each is handed to the template its own way, and all train the same tokens."""
    fam = next(f for f in FAMILIES if f.name == "qwen3")
    folder = tmp_path / "qwen3"
    build_tokenizer(fam, folder)
    user = msg("user", "What is 2+2?")
    forms = {
        "reasoning_content": {
            "role": "assistant",
            "content": "It is 4.",
            "reasoning_content": "Two and two.",
        },
        "thinking": {"role": "assistant", "content": "It is 4.", "thinking": "Two and two."},
        "reasoning": {"role": "assistant", "content": "It is 4.", "reasoning": "Two and two."},
        "inline": {"role": "assistant", "content": "<think>\nTwo and two.\n</think>\n\nIt is 4."},
        "inline_opened_in_prompt": {"role": "assistant", "content": "Two and two.\n</think>\n\nIt is 4."},
    }
    meta, data = run_stage(tmp_path, folder, [{"id": k, "messages": [user, a]} for k, a in forms.items()])
    rows = list(data.values())
    assert len(rows) == 5 and all(r == {**rows[0], "id": r["id"]} for r in rows)
    assert meta["reasoning"]["rendered"] == 5
