"""Tests for the tokenize stage: template rendering, assistant-only loss masks, counts, errors."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import hashlib
import json
import logging
import runpy
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from eaglenest.core.errors import EaglenestError
from eaglenest.data.chat_turns import ChatTurns
from eaglenest.data.tokenize import (
    Renderers,
    assistant_mask,
    chat_template_hash,
    encode_rows,
    prepare_messages,
    tokenize_stage,
    training_rows,
)
from eaglenest.target.resolve import load_tokenizer

REPO = Path(__file__).resolve().parents[1]
TEMPLATES = Path(__file__).parent / "data" / "templates"
CHATML = (TEMPLATES / "chatml.jinja").read_text()
QWEN3 = (TEMPLATES / "qwen3_style.jinja").read_text()

CORPUS = [
    "you are a helpful assistant",
    "what is two plus two",
    "two plus two is four",
    "the quick brown fox jumps over the lazy dog",
    "think step by step and answer briefly",
    "hello there, how are you today?",
]
PADDED_VOCAB = 512  # config.json vocab_size: larger than len(tokenizer), like padded embeddings


@pytest.fixture(scope="module")
def base_tokenizers():
    """Two trained byte-level BPE tokenizers: with and without <think> tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    def train(think: bool):
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=400,
            special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(CORPUS * 4, trainer=trainer)
        if think:  # like Qwen3: added, not special
            tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("<think>", "</think>")])
        return tok.to_str()

    return {True: train(True), False: train(False)}


@pytest.fixture
def make_target(tmp_path, base_tokenizers):
    """Write a target dir (tokenizer files + chat template + config.json); return its path."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    def make(template: str, think: bool = True, vocab_size: int | None = PADDED_VOCAB, name="target"):
        d = tmp_path / name
        fast = PreTrainedTokenizerFast(
            tokenizer_object=Tokenizer.from_str(base_tokenizers[think]),
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
        )
        fast.chat_template = template
        fast.save_pretrained(d)
        cfg = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 8}
        if vocab_size is not None:
            cfg["vocab_size"] = vocab_size
        (d / "config.json").write_text(json.dumps(cfg))
        return d

    return make


def write_rows(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def run(tmp_path, target, rows, max_seq_len=4096, overlong="truncate", **kw):
    responses = write_rows(tmp_path / "raw_responses.jsonl", rows)
    out = tmp_path / "out"
    meta = tokenize_stage(
        responses, target, max_seq_len, overlong,
        out / "tokenized_data.jsonl", out / "token_freq.pt", out / "metadata.json", **kw,
    )  # fmt: skip
    data = [json.loads(line) for line in (out / "tokenized_data.jsonl").read_text().splitlines()]
    return meta, data, out


def masked_runs(tokenizer, ids, mask):
    """Decode each maximal run of masked tokens, token by token (concatenated single decodes)."""
    runs, cur = [], None
    for t, m in zip(ids, mask):
        if m:
            cur = (cur or "") + tokenizer.decode([t])
        elif cur is not None:
            runs.append(cur)
            cur = None
    if cur is not None:
        runs.append(cur)
    return runs


def unmasked_text(tokenizer, ids, mask):
    return "".join(tokenizer.decode([t]) for t, m in zip(ids, mask) if not m)


SYSTEM = {"role": "system", "content": "you are a helpful assistant"}
USER = {"role": "user", "content": "what is two plus two"}


def conv(answer="four", reasoning=None, rid="a"):
    a = {"role": "assistant", "content": answer}
    if reasoning is not None:
        a["reasoning_content"] = reasoning
    return {"id": rid, "messages": [SYSTEM, USER, a]}


# --------------------------------------------------------------------------------------------
# Masks, token by token
# --------------------------------------------------------------------------------------------


def test_chatml_reasoning_inlined_with_think_tokens(tmp_path, make_target):
    target = make_target(CHATML, think=True)
    meta, data, _ = run(tmp_path, target, [conv("four", "two plus two is four")])
    tok = load_tokenizer(target)
    (row,) = data
    assert len(row["input_ids"]) == len(row["loss_mask"])
    assert masked_runs(tok, row["input_ids"], row["loss_mask"]) == [
        "<think>\ntwo plus two is four\n</think>\n\nfour<|im_end|>"
    ]
    assert unmasked_text(tok, row["input_ids"], row["loss_mask"]) == (
        "<|im_start|>system\nyou are a helpful assistant<|im_end|>\n"
        "<|im_start|>user\nwhat is two plus two<|im_end|>\n<|im_start|>assistant\n\n"
    )
    assert meta["reasoning"] == {
        "passed_as": "inline", "assistant_turns_with_reasoning": 1,
        "rendered": 1, "dropped_by_template": 0, "dropped_unsupported": 0,
    }  # fmt: skip


def test_chatml_without_think_tokens_drops_reasoning(tmp_path, make_target):
    target = make_target(CHATML, think=False)
    meta, data, _ = run(tmp_path, target, [conv("four", "secret"), conv("four", None, rid="b")])
    tok = load_tokenizer(target)
    for row in data:
        assert masked_runs(tok, row["input_ids"], row["loss_mask"]) == ["four<|im_end|>"]
        assert "secret" not in tok.decode(row["input_ids"])
    assert meta["reasoning"] == {
        "passed_as": None, "assistant_turns_with_reasoning": 1,
        "rendered": 0, "dropped_by_template": 0, "dropped_unsupported": 1,
    }  # fmt: skip


def test_qwen3_style_template_renders_reasoning(tmp_path, make_target):
    target = make_target(QWEN3, think=True)
    meta, data, _ = run(tmp_path, target, [conv("the answer is four", "two plus two is four")])
    tok = load_tokenizer(target)
    (row,) = data
    ids, mask = row["input_ids"], row["loss_mask"]
    assert masked_runs(tok, ids, mask) == [
        "<think>\ntwo plus two is four\n</think>\n\nthe answer is four<|im_end|>"
    ]
    un = unmasked_text(tok, ids, mask)
    assert "you are a helpful assistant" in un and "what is two plus two" in un
    assert un.endswith("<|im_start|>assistant\n\n")  # header unmasked, trailing "\n" too
    # same ids as the template's own tokenization
    msgs = [SYSTEM, USER, {"role": "assistant", "content": "the answer is four",
                           "reasoning_content": "two plus two is four"}]  # fmt: skip
    assert ids == list(tok.apply_chat_template(msgs, tokenize=True, return_dict=False))
    assert meta["reasoning"]["passed_as"] == "reasoning_content"
    assert meta["assistant_turns"] == {"total": 1, "masked": 1, "unmasked": 0, "context_by_policy": 0}


def test_multi_turn_chatml_masks_every_assistant_turn(tmp_path, make_target):
    target = make_target(CHATML, think=True)
    rows = [{"id": "m", "messages": [
        SYSTEM, USER, {"role": "assistant", "content": "four"},
        {"role": "user", "content": "and the fox?"},
        {"role": "assistant", "content": "it jumps", "reasoning_content": "the quick brown fox"},
    ]}]  # fmt: skip
    meta, data, _ = run(tmp_path, target, rows)
    tok = load_tokenizer(target)
    (row,) = data
    assert masked_runs(tok, row["input_ids"], row["loss_mask"]) == [
        "four<|im_end|>",
        "<think>\nthe quick brown fox\n</think>\n\nit jumps<|im_end|>",
    ]
    un = unmasked_text(tok, row["input_ids"], row["loss_mask"])
    assert "<|im_start|>user\nand the fox?<|im_end|>" in un
    assert un.count("<|im_start|>assistant\n") == 2
    assert meta["assistant_turns"] == {"total": 2, "masked": 2, "unmasked": 0, "context_by_policy": 0}


def test_multi_turn_qwen3_style_breaks_prefix_property(tmp_path, make_target):
    """Qwen3 drops the reasoning of earlier turns (and the empty think block of a final turn
    appears only when it is last): the earlier turn is still masked as the full render shows it."""
    target = make_target(QWEN3, think=True)
    tok = load_tokenizer(target)
    msgs = [
        SYSTEM, USER, {"role": "assistant", "content": "four", "reasoning_content": "two plus two"},
        {"role": "user", "content": "and the fox?"},
        {"role": "assistant", "content": "it jumps", "reasoning_content": "the quick brown fox"},
    ]  # fmt: skip
    # the prefix render of the first turn is not a prefix of the full render
    full = tok.apply_chat_template(msgs, tokenize=False)
    assert not full.startswith(tok.apply_chat_template(msgs[:3], tokenize=False))
    meta, data, _ = run(tmp_path, target, [{"id": "q", "messages": msgs}])
    (row,) = data
    assert masked_runs(tok, row["input_ids"], row["loss_mask"]) == [
        "four<|im_end|>",
        "<think>\nthe quick brown fox\n</think>\n\nit jumps<|im_end|>",
    ]
    assert "two plus two\n</think>" not in tok.decode(row["input_ids"])
    assert meta["assistant_turns"] == {"total": 2, "masked": 2, "unmasked": 0, "context_by_policy": 0}


def encode(tok, convs, **kw):
    """encode_rows on raw conversations, one row each (policy "all")."""
    rows = [
        r
        for k, c in enumerate(convs)
        for r in training_rows(str(k), prepare_messages({"id": str(k), "messages": c}), None, "all")
    ]
    return encode_rows(Renderers(tok), rows, **kw)


def test_turn_the_template_does_not_write_is_counted_unmasked(tmp_path, make_target):
    """A template that writes a placeholder instead of earlier answers: that turn cannot be
    trained, and says so in the counts; the final turn is masked."""
    hiding = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{% if m.role == 'assistant' and not loop.last %}[hidden]{% else %}{{ m.content }}{% endif %}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    target = make_target(hiding, think=False)
    rows = [
        {
            "id": "h",
            "messages": [
                USER,
                {"role": "assistant", "content": "four"},
                {"role": "user", "content": "and the fox?"},
                {"role": "assistant", "content": "it jumps"},
            ],
        }
    ]
    meta, data, _ = run(tmp_path, target, rows)
    tok = load_tokenizer(target)
    assert masked_runs(tok, data[0]["input_ids"], data[0]["loss_mask"]) == ["it jumps<|im_end|>"]
    assert meta["assistant_turns"] == {"total": 2, "masked": 1, "unmasked": 1, "context_by_policy": 0}


def test_encode_matches_apply_chat_template_batch(make_target):
    tok = load_tokenizer(make_target(QWEN3))
    convs = [conv("four", "r")["messages"], conv("it jumps")["messages"]]
    res = encode(tok, convs)
    ref = tok.apply_chat_template(convs, tokenize=True, return_dict=False)
    assert [r["input_ids"].tolist() for r in res] == [list(x) for x in ref]


def test_boundary_lookup_matches_offsets_with_multibyte_text(make_target):
    """The char_to_token boundary lookup gives the same mask as scanning every offset, also when
    byte-level tokens split multi-byte characters at a turn boundary."""
    tok = load_tokenizer(make_target(QWEN3))
    convs = [
        [USER, {"role": "assistant", "content": "\u00e9\u00e9 caf\u00e9 \U0001f98a fox", "reasoning_content": "\u4e8c\u52a0\u4e8c"}],
        [{"role": "user", "content": "\U0001f98a"}, {"role": "assistant", "content": "\U0001f98a"},
         {"role": "user", "content": "\u00e9"}, {"role": "assistant", "content": " spaced  "}],
    ]  # fmt: skip
    chat = ChatTurns(tok)
    placed = [chat.place(prepare_messages({"id": "x", "messages": c})) for c in convs]
    enc = tok([text for text, _ in placed], add_special_tokens=False)
    for r, e, (_, places) in zip(encode(tok, convs), enc.encodings, placed):
        assert r["loss_mask"].tolist() == assistant_mask(e.offsets, [p.span for p in places]).tolist()
        assert r["loss_mask"].sum() > 0
    r = encode(tok, convs[:1])[0]
    masked = tok.decode(r["input_ids"][r["loss_mask"].astype(bool)].tolist())
    assert (
        masked == "<think>\n\u4e8c\u52a0\u4e8c\n</think>\n\n\u00e9\u00e9 caf\u00e9 \U0001f98a fox<|im_end|>"
    )


@pytest.mark.parametrize("template", ["chatml", "qwen3"])
def test_masks_without_offsets_equal_the_offset_masks(make_target, template):
    """Slow and remote-code tokenizers (Kimi's tiktoken one) have no character offsets: their
    boundaries come from tokenizing the text before each one. On fast tokenizers both ways
    must give the same mask, token for token, including turns that start or end inside a run
    of whitespace or multi-byte characters, where one token straddles the boundary."""
    tok = load_tokenizer(make_target(CHATML if template == "chatml" else QWEN3))
    convs = [
        [SYSTEM, USER, {"role": "assistant", "content": "four", "reasoning_content": "two"}],
        [USER, {"role": "assistant", "content": "\n\n  leading blank lines"}],
        [USER, {"role": "assistant", "content": "\u00e9\u00e9 caf\u00e9 \U0001f98a"},
         {"role": "user", "content": "\U0001f98a"}, {"role": "assistant", "content": " x  "}],
        [USER, {"role": "assistant", "content": ""}],
    ]  # fmt: skip
    with_offsets = encode(tok, convs)
    without = encode(tok, convs, force_prefix_boundaries=True)
    for a, b in zip(with_offsets, without, strict=True):
        assert a["input_ids"].tolist() == b["input_ids"].tolist()
        assert a["loss_mask"].tolist() == b["loss_mask"].tolist()
        assert a["loss_mask"].sum() > 0


# --------------------------------------------------------------------------------------------
# Lengths, counts, metadata, token_freq
# --------------------------------------------------------------------------------------------


def test_truncate_counts_and_zero_mask_rows(tmp_path, make_target):
    target = make_target(CHATML)
    tok = load_tokenizer(target)
    prompt_len = len(tok.apply_chat_template([SYSTEM, USER], tokenize=True, add_generation_prompt=True,
                                             return_dict=False))  # fmt: skip
    long_answer = "the quick brown fox jumps over the lazy dog " * 3
    rows = [
        conv("four", rid="short"),
        conv(long_answer, rid="long"),
        {"id": "no_room", "messages": [SYSTEM, {"role": "user", "content": " ".join(CORPUS) * 2},
                                       {"role": "assistant", "content": "four"}]},
    ]  # fmt: skip
    short_len = len(tok.apply_chat_template(rows[0]["messages"], tokenize=True, return_dict=False))
    max_len = prompt_len + 5
    assert short_len <= max_len
    meta, data, _ = run(tmp_path, target, rows, max_seq_len=max_len, overlong="truncate")
    assert [r["id"] for r in data] == ["short", "long"]
    assert len(data[1]["input_ids"]) == len(data[1]["loss_mask"]) == max_len
    assert sum(data[1]["loss_mask"]) == 5
    assert meta["truncated"] == 1
    assert meta["skipped"] == {
        "regeneration_failed": 0,
        "overlong": 0,
        "no_assistant_tokens": 1,
        "template_mismatch": 0,
        "opens_with_assistant": 0,
    }
    assert meta["samples_in"] == 3 and meta["samples_out"] == 2


def test_drop_overlong(tmp_path, make_target):
    target = make_target(CHATML)
    rows = [conv("four", rid="short"), conv("the quick brown fox jumps over the lazy dog " * 5, rid="long")]
    tok = load_tokenizer(target)
    short_len = len(tok.apply_chat_template(rows[0]["messages"], tokenize=True, return_dict=False))
    meta, data, _ = run(tmp_path, target, rows, max_seq_len=short_len, overlong="drop")
    assert [r["id"] for r in data] == ["short"]
    assert meta["skipped"]["overlong"] == 1 and meta["truncated"] == 0


def test_metadata_and_token_freq(tmp_path, make_target):
    target = make_target(QWEN3)
    rows = [
        conv("four", "two plus two is four", rid="a"),
        {"id": "failed", "error": "HTTP 500"},
        conv("hello there", rid="b"),
        "",  # blank lines are ignored
        {"id": "m", "messages": [USER, {"role": "assistant", "content": "four"},
                                 {"role": "user", "content": "why?"},
                                 {"role": "assistant", "content": "think step by step"}]},
    ]  # fmt: skip
    meta, data, out = run(tmp_path, target, rows, target_name="tiny", target_revision="abc123")
    assert meta == json.loads((out / "metadata.json").read_text())
    assert meta["samples_in"] == 4
    assert meta["samples_out"] == 3
    assert meta["skipped"]["regeneration_failed"] == 1
    assert meta["samples_in"] == meta["samples_out"] + sum(meta["skipped"].values())
    assert meta["tokens_total"] == sum(len(r["input_ids"]) for r in data)
    assert meta["tokens_loss_masked"] == sum(sum(r["loss_mask"]) for r in data)
    assert meta["chat_template_hash"] == hashlib.sha256(QWEN3.encode()).hexdigest()
    tok = load_tokenizer(target)
    assert chat_template_hash(tok) == meta["chat_template_hash"]
    assert meta["target_name"] == "tiny" and meta["target_revision"] == "abc123"
    assert meta["tokenizer_vocab_size"] == len(tok) < PADDED_VOCAB
    assert meta["target_vocab_size"] == PADDED_VOCAB
    assert meta["max_seq_len"] == 4096
    freq = torch.load(out / "token_freq.pt")
    assert freq.dtype == torch.int64 and freq.shape == (PADDED_VOCAB,)
    masked = np.concatenate([np.array(r["input_ids"])[np.array(r["loss_mask"], bool)] for r in data])
    assert torch.equal(freq, torch.bincount(torch.from_numpy(masked), minlength=PADDED_VOCAB))
    assert int(freq.sum()) == meta["tokens_loss_masked"]
    assert all(set(r) == {"id", "input_ids", "loss_mask"} for r in data)
    assert sorted(p.name for p in out.iterdir()) == ["metadata.json", "token_freq.pt", "tokenized_data.jsonl"]


# --------------------------------------------------------------------------------------------
# Errors: message names the problem, no outputs left behind
# --------------------------------------------------------------------------------------------

BAD_ROWS = {
    "malformed": (['{"id": "a", "messages": []', ], "line 1: malformed JSON"),
    "empty": ([{"id": "e", "messages": []}], "id 'e'): empty conversation"),
    "no_assistant": ([{"id": "n", "messages": [SYSTEM, USER]}], "id 'n'): no assistant turn"),
    "unknown_role": ([{"id": "r", "messages": [{"role": "developer", "content": "x"},
                                               {"role": "assistant", "content": "y"}]}],
                     "id 'r'): message 0 has unknown role 'developer'"),
    "assistant_not_last": ([{"id": "l", "messages": [USER, {"role": "assistant", "content": "y"}, USER]}],
                           "id 'l'): the last message must be the assistant response"),
    "neither": ([{"id": "x"}], "id 'x'): has neither 'messages' nor 'error'"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_bad_rows_raise_and_write_nothing(tmp_path, make_target, case):
    rows, text = BAD_ROWS[case]
    target = make_target(CHATML)
    rows = [conv("fine", rid="ok"), *rows]
    if case == "malformed":
        text = "line 2: malformed JSON"
    with pytest.raises(EaglenestError, match=None) as ei:
        run(tmp_path, target, rows)
    assert text in str(ei.value)
    assert "raw_responses.jsonl" in str(ei.value)
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


def test_missing_target_dir(tmp_path):
    write_rows(tmp_path / "r.jsonl", [conv()])
    out = tmp_path / "out"
    with pytest.raises(EaglenestError, match="target model directory does not exist"):
        tokenize_stage(tmp_path / "r.jsonl", tmp_path / "nope", 64, "truncate",
                           out / "d.jsonl", out / "f.pt", out / "m.json")  # fmt: skip
    assert not out.exists() or list(out.iterdir()) == []


def test_missing_config_vocab(tmp_path, make_target):
    target = make_target(CHATML, vocab_size=None)
    with pytest.raises(EaglenestError, match="vocab_size must be a positive integer"):
        run(tmp_path, target, [conv()])
    out = tmp_path / "out"
    assert not out.exists() or list(out.iterdir()) == []


def test_token_outside_config_vocab_is_hard_error(tmp_path, make_target):
    target = make_target(CHATML, vocab_size=100)  # smaller than the tokenizer: ids will overflow
    with pytest.raises(EaglenestError, match=r"id 'a': token id \d+ is outside the target's vocab"):
        run(tmp_path, target, [conv("the quick brown fox")])
    out = tmp_path / "out"
    assert not out.exists() or list(out.iterdir()) == []


def test_bad_policy(tmp_path, make_target):
    with pytest.raises(EaglenestError, match="overlong must be one of"):
        run(tmp_path, make_target(CHATML), [conv()], overlong="cut")


# --------------------------------------------------------------------------------------------
# Snakemake adapter and the tiny target
# --------------------------------------------------------------------------------------------


def test_snakemake_adapter(tmp_path, make_target):
    from conftest import target_record

    target = make_target(CHATML)
    (target / "model.safetensors").write_bytes(b"\0")  # resolve_target wants weights
    record = target_record(target, tmp_path / "target.json")
    responses = write_rows(tmp_path / "raw.jsonl", [conv()])
    out = tmp_path / "out"
    sm = types.SimpleNamespace(
        input=types.SimpleNamespace(responses=str(responses), target=str(record)),
        params=types.SimpleNamespace(
            run_dir=str(tmp_path / "run"), max_seq_len=64, overlong="drop", multi_turn="all", target_name="t"
        ),
        output=types.SimpleNamespace(
            data=str(out / "d.jsonl"), freq=str(out / "f.pt"), metadata=str(out / "m.json")
        ),
        log=[str(tmp_path / "log.txt")],
        threads=2,  # the rule's threads: tokenize's worker processes
    )
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        runpy.run_path(
            str(REPO / "scripts" / "tokenize.py"), init_globals={"snakemake": sm}, run_name="__main__"
        )
    finally:  # the adapter points root logging at the rule's log file; undo that
        for h in root.handlers:
            if h not in saved[0]:
                h.close()
        root.handlers[:], root.level = saved[0], saved[1]
    assert "tokenize: 1 rows in (+0 from expansion), 1 out" in (tmp_path / "log.txt").read_text()
    meta = json.loads((out / "m.json").read_text())
    assert meta["samples_out"] == 1 and meta["target_name"] == "t" and meta["target_revision"] is None
    assert (out / "d.jsonl").exists() and (out / "f.pt").exists()


def test_tiny_target(tmp_path):
    from eaglenest.target.tiny import build_tiny_target  # part of the package: a failed import is a failure

    prompts = write_rows(tmp_path / "prompts.jsonl", [
        {"id": str(i), "messages": [{"role": "user", "content": c}]} for i, c in enumerate(CORPUS)
    ])  # fmt: skip
    target = build_tiny_target(tmp_path / "tiny", [prompts], num_layers=8, hidden_size=32,
                               intermediate_size=64, num_heads=2, num_kv_heads=1, vocab_size=600,
                               pretrain_steps=0)  # fmt: skip  # its weights play no part here
    meta, data, out = run(
        tmp_path, target, [conv("four", "two plus two is four"), conv("hello there", rid="b")]
    )
    tok = load_tokenizer(target)
    vocab = json.loads((Path(target) / "config.json").read_text())["vocab_size"]
    assert meta["target_vocab_size"] == vocab and meta["tokenizer_vocab_size"] == len(tok)
    assert torch.load(out / "token_freq.pt").shape == (vocab,)
    assert meta["samples_out"] == 2
    runs = masked_runs(tok, data[0]["input_ids"], data[0]["loss_mask"])
    assert len(runs) == 1 and runs[0].endswith("four<|im_end|>")
    assert "two plus two is four" in runs[0]  # reasoning is part of the masked assistant turn
    un = unmasked_text(tok, data[0]["input_ids"], data[0]["loss_mask"])
    assert "<|im_start|>assistant\n" in un and "what is two plus two" in un
    assert masked_runs(tok, data[1]["input_ids"], data[1]["loss_mask"]) == ["hello there<|im_end|>"]


@pytest.fixture(scope="module")
def kimi_target(tmp_path_factory):
    """The Kimi-K2.5 miniature's folder, untrained: its remote-code tiktoken tokenizer has no
    character offsets, and Kimi-K2-Thinking's template renders it."""
    from eaglenest.target.kimi_mini import build_kimi_mini

    return build_kimi_mini(
        tmp_path_factory.mktemp("kimi") / "model",
        [REPO / "data" / "tiny_target" / "corpus.jsonl"],
        pretrain_steps=0,
    )


def test_remote_code_tokenizer_masks_every_turn_without_offsets(tmp_path, kimi_target):
    tok = load_tokenizer(kimi_target, trust_remote_code=True)
    assert not tok.is_fast
    rows = [{"id": "k", "messages": [
        USER, {"role": "assistant", "content": "four"},
        {"role": "user", "content": "and caf\u00e9 \U0001f98a?"},
        {"role": "assistant", "content": "<b>it jumps</b> \u00e9"},
    ]}]  # fmt: skip
    meta, data, _ = run(tmp_path, kimi_target, rows, trust_remote_code=True)
    (row,) = data
    # What this template renders for each assistant turn after its generation prompt
    # (<|im_assistant|>assistant<|im_middle|>): an empty think block, the answer, <|im_end|>.
    # (Runs decoded whole: byte-level tokens split the multi-byte characters.)
    ids, mask = np.asarray(row["input_ids"]), np.asarray(row["loss_mask"])
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask, [0]))))
    assert [tok.decode(ids[a:b].tolist()) for a, b in zip(edges[::2], edges[1::2])] == [
        "<think></think>four<|im_end|>",
        "<think></think><b>it jumps</b> \u00e9<|im_end|>",
    ]
    un = tok.decode(ids[mask == 0].tolist())
    assert un.count("<|im_assistant|>assistant<|im_middle|>") == 2 and "caf\u00e9" in un
    assert meta["assistant_turns"] == {"total": 2, "masked": 2, "unmasked": 0, "context_by_policy": 0}
    assert meta["target_vocab_size"] == len(tok)


def test_a_remote_code_tokenizer_without_trust_says_which_key_to_set(tmp_path, kimi_target):
    with pytest.raises(EaglenestError, match=r"remote code .*set target.trust_remote_code: true"):
        run(tmp_path, kimi_target, [conv()])
    assert not (tmp_path / "out" / "tokenized_data.jsonl").exists()


def test_leading_assistant_turn_without_a_header_to_find_is_skipped_by_name(tmp_path, make_target, caplog):
    """A template that renders no generation prompt at all gives no header to find: a
    conversation opening with an assistant turn is skipped under its own reason, with its id in
    the log, rather than masked from a guess."""
    no_prompt = (
        "{% if add_generation_prompt %}{{ raise_exception('no generation prompt') }}{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    )
    target = make_target(no_prompt, think=False)
    rows = [
        {
            "id": "greeting",
            "messages": [
                {"role": "assistant", "content": "hi"},
                USER,
                {"role": "assistant", "content": "four"},
            ],
        }
    ]
    with caplog.at_level(logging.WARNING):
        meta, data, _ = run(tmp_path, target, rows)
    assert data == [] and meta["skipped"]["opens_with_assistant"] == 1
    assert "'greeting' (opens_with_assistant)" in caplog.text


@pytest.mark.parametrize("tokenizer", ["kimi remote code", "fast (Rust, thread pool)"])
def test_worker_processes_write_the_same_bytes_as_one(
    tmp_path, kimi_target, make_target, monkeypatch, tokenizer
):
    """tokenize.processes: chunks go to forked workers and come back in order; every output is
    the same bytes as the single-process run's. The single-process run goes first in the same
    process, so a fast tokenizer's thread pool is running when the workers fork (a worker that
    used the inherited pool would wait forever)."""
    import eaglenest.data.tokenize as tokenize_mod

    fast = tokenizer.startswith("fast")
    target = make_target(CHATML) if fast else kimi_target
    # As users often set it: the thread pool on, and tokenizers' own fork guard off with it.
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    monkeypatch.setattr(tokenize_mod, "_CHUNK_ROWS", 3)  # many chunks, several in flight
    rows = []
    for i in range(40):
        if i % 9 == 4:
            rows.append({"id": f"f{i}", "error": "HTTP 500"})
            continue
        answer = f"{CORPUS[i % len(CORPUS)]} {i}"
        rows.append(conv(answer, reasoning="step by step" if i % 2 else None, rid=f"r{i}"))
    outputs = {}
    for procs in (1, 2):
        (tmp_path / f"p{procs}").mkdir()
        meta, _, out = run(tmp_path / f"p{procs}", target, rows, trust_remote_code=not fast, processes=procs)
        outputs[procs] = {f.name: f.read_bytes() for f in out.iterdir()}
    assert outputs[1] == outputs[2]
    assert meta["samples_out"] == 36 and meta["skipped"]["regeneration_failed"] == 4
