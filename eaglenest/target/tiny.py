"""A tiny Llama target built locally, so the default run needs no download.

The embedded default trains a draft for this model end to end on a CPU. It is a real
`LlamaForCausalLM` with a real byte-level BPE tokenizer and a ChatML chat template with
thinking markers, so vLLM serves it and the template, loss-mask and vocabulary stages work on it
exactly as on a production target.

It learns from its own small corpus (`data/tiny_target/corpus.jsonl`), not from the prompts the
workflow later sends it: like a real model, it answers prompts it has not seen. Its weights are
trained (seeded, on the corpus rendered as chat turns, each text answered by the next few, one
per line) rather than left random: a random network answers every prompt with a token loop,
which n-gram lookup predicts trivially and which no served model produces. Training gives the
target what real ones have: confident text it prefers, answers of several lines, turns it ends
with its end-of-turn token. Trained to a low loss (the default config), it answers a new prompt
by picking corpus texts and reciting them, which is more predictable than a real model's text.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from eaglenest.core.errors import EaglenestError
from eaglenest.core.io import atomic_path, iter_jsonl
from eaglenest.target.resolve import BUILD_MARKER, BUILDERS, check_build_destination

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]

# ChatML with a Qwen3-style thinking block: reasoning of an assistant turn is rendered inside
# <think>...</think> before its answer, the way serving renders it.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['role'] == 'assistant' and message.get('reasoning_content') %}"
    "<think>\n{{ message['reasoning_content'] }}\n</think>\n\n"
    "{% endif %}"
    "{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def corpus_from_prompts(paths) -> list[str]:
    """The texts of every message in the given prompt files (JSONL, any accepted schema)."""
    texts: list[str] = []
    for path in paths:
        for row in iter_jsonl(path):
            for m in row.get("messages") or row.get("conversations") or []:
                text = m.get("content", m.get("value"))
                if isinstance(text, str):
                    texts.append(text)
            if isinstance(row.get("prompt"), str):
                texts.append(row["prompt"])
    if not texts:
        raise EaglenestError("no text to train the tiny tokenizer on", paths[0] if paths else None)
    return texts


def build_tokenizer(texts: list[str], vocab_size: int):
    """Train a byte-level BPE tokenizer and wrap it as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def pretrain(
    model,
    tokenizer,
    texts: list[str],
    *,
    steps: int,
    seed: int,
    seq_len: int = 128,
    batch_size: int = 8,
    lr: float = 3e-3,
    answer_texts: int = 3,
) -> list[float]:
    """Teach the model the chat format on the corpus: each text answered by the next few, one
    per line (joined by spaces, a text ending in "?" then reads like the end of a user turn and
    the answers stop after one sentence)."""
    import torch

    n = len(texts)
    convs = [
        [
            {"role": "user", "content": texts[i]},
            {
                "role": "assistant",
                "content": "\n".join(texts[(i + j) % n] for j in range(1, answer_texts + 1)),
            },
        ]
        for i in range(n)
    ]
    rendered = tokenizer.apply_chat_template(convs, tokenize=False)
    stream = torch.tensor([t for r in rendered for t in tokenizer(r)["input_ids"]])
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1 - i / max(steps, 1))
    losses = []
    model.train()
    for _ in range(steps):
        starts = torch.randint(0, len(stream) - seq_len - 1, (batch_size,), generator=gen)
        batch = torch.stack([stream[i : i + seq_len] for i in starts.tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    model.eval()
    return losses


def _seeded_model(config, tokenizer, texts: list[str], *, steps: int, seed: int):
    """The Llama of `config`, seeded, then pretrained on the corpus for `steps` steps (if any)."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    if steps:
        losses = pretrain(model, tokenizer, texts, steps=steps, seed=seed)
        log.info("tiny target trained %d steps: loss %.2f -> %.2f", steps, losses[0], losses[-1])
    return model


def build_tiny_target(
    out_dir,
    prompt_files,
    *,
    num_layers: int = 8,
    hidden_size: int = 128,
    intermediate_size: int = 384,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    vocab_size: int = 2048,
    max_position_embeddings: int = 2048,
    pretrain_steps: int = 200,
    seed: int = 0,
) -> Path:
    """Write a servable tiny Llama (config, weights, tokenizer, template) into `out_dir`."""
    from transformers import GenerationConfig, LlamaConfig

    check_build_destination(str(out_dir), "llama")  # its folder is replaced whole: never a user's
    if num_layers < 8:
        # The default aux layers [2, n//2, n-3] collide below 8 layers.
        raise EaglenestError(f"num_layers must be at least 8, got {num_layers}")
    texts = corpus_from_prompts(list(prompt_files))
    tokenizer = build_tokenizer(texts, vocab_size)
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = _seeded_model(config, tokenizer, texts, steps=pretrain_steps, seed=seed)
    with atomic_path(out_dir, is_dir=True) as tmp:
        tmp.chmod(0o755)
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id).save_pretrained(tmp)
        marker = {"built_by": BUILDERS["llama"], "seed": seed, "pretrain_steps": pretrain_steps}
        (tmp / BUILD_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    log.info(
        "tiny target: %d layers, hidden %d, vocab %d -> %s", num_layers, hidden_size, vocab_size, out_dir
    )
    return Path(out_dir)
