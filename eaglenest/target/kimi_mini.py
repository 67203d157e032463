"""A miniature of moonshotai/Kimi-K2.5 built locally: CI runs the pipeline on the seed case's shape.

The folder it writes is laid out like the hub's: `config.json` with `model_type: kimi_k25`, a
DeepSeek-V3 text model (MLA, MoE with routed and shared experts, a dense first layer) nested under
`text_config` beside a small MoonViT vision tower; one `model.safetensors` with the hub's weight
names (what vLLM's loader and transformers' checkpoint conversion expect, not what transformers'
`save_pretrained` writes); a tiktoken tokenizer that loads only as remote code; Kimi-K2-Thinking's
own chat template; and the processor config vLLM needs to start with the vision tower present.
Everything that differs from the seed case on the pipeline's path (config nesting, remote-code
tokenizer without offsets, MLA attention, MoE, a thinking template that drops history reasoning,
the reasoning parser) is therefore exercised by a model that builds in minutes on a CPU.

Sizes are the smallest vLLM's CPU build serves: MLA needs kv_lora_rank + qk_rope_head_dim == 576
there (Kimi's own 512 + 64), so attention dominates the parameter count (about 1 M in all). The
vision tower stays random; the text model is trained briefly (seeded) on the corpus rendered as
thinking chat turns, each answered the way the served model then emits it
(`<think>reasoning</think>answer<|im_end|>`), so at serving time it reasons, answers and ends its
turn instead of looping, as the tiny Llama does (see eaglenest/target/tiny.py).
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import json
import logging
import math
import shutil
import time
from pathlib import Path

from eaglenest.core.errors import EaglenestError
from eaglenest.core.io import atomic_path, iter_jsonl
from eaglenest.target.resolve import BUILD_MARKER, BUILDERS
from eaglenest.target.tiny import corpus_from_prompts

log = logging.getLogger(__name__)

ASSETS = Path(__file__).resolve().parent / "assets" / "kimi_mini"
TOKENIZER_MODULE = "tokenization_kimi_mini"
TOKENIZER_CLASS = "TikTokenTokenizer"

# Kimi keeps 256 ids after its 163,584 BPE ranks for special tokens; these sit at Kimi's offsets
# (163586 <|im_end|>, 163605 <|media_pad|>, 163606 <think>, ...), the other ids are reserved.
# (offset, token, special): the thinking and tool-call markers are not special, so decoding
# keeps them in the text the reasoning and tool parsers read.
SPECIAL_TOKENS = [
    (0, "[BOS]", True),
    (1, "[EOS]", True),
    (2, "<|im_end|>", True),
    (3, "<|im_user|>", True),
    (4, "<|im_assistant|>", True),
    (6, "<|start_header_id|>", True),
    (7, "<|end_header_id|>", True),
    (9, "[EOT]", True),
    (10, "<|im_system|>", True),
    (11, "<|tool_calls_section_begin|>", False),
    (12, "<|tool_calls_section_end|>", False),
    (13, "<|tool_call_begin|>", False),
    (14, "<|tool_call_argument_begin|>", False),
    (15, "<|tool_call_end|>", False),
    (17, "<|im_middle|>", True),
    (18, "<|media_begin|>", True),
    (19, "<|media_content|>", True),
    (20, "<|media_end|>", True),
    (21, "<|media_pad|>", True),
    (22, "<think>", False),
    (23, "</think>", False),
    (254, "[UNK]", True),
    (255, "[PAD]", True),
]
NUM_SPECIAL_IDS = 256

# The MLA size vLLM's CPU attention kernel accepts (kv_lora_rank + qk_rope_head_dim).
KV_LORA_RANK, QK_ROPE_HEAD_DIM = 512, 64

# MoonViT, as small as it goes: vLLM builds it whenever the config has a vision tower.
VISION_CONFIG = {
    "patch_size": 14,
    "pos_emb_height": 8,
    "pos_emb_width": 8,
    "pos_emb_time": 4,
    "num_attention_heads": 2,
    "num_hidden_layers": 1,
    "hidden_size": 32,
    "intermediate_size": 64,
    "hidden_act": "gelu_pytorch_tanh",
    "merge_kernel_size": [2, 2],
    "merge_type": "sd2_tpool",
    "mm_projector_type": "patchmerger",
    "pos_emb_type": "divided_fixed",
    "video_attn_type": "spatial_temporal",
}

# The hub's media processing settings with small patch limits: vLLM sizes its profiling run by
# the largest image, and a full-size one would not fit a 1,024-token context.
MEDIA_PROC_CFG = {
    "patch_size": 14,
    "merge_kernel_size": 2,
    "in_patch_limit": 256,
    "patch_limit_on_one_side": 32,
    "in_patch_limit_each_frame": 256,
    "in_patch_limit_video": None,
    "fixed_output_tokens": None,
    "temporal_merge_kernel_size": 4,
    "sample_fps": 2.0,
    "max_num_frames_each_video": None,
    "timestamp_mode": "hh:mm:ss.fff",
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}


@functools.cache
def tokenizer_module():
    """The shipped remote-code tokenizer module, imported from its file as a model folder's is."""
    spec = importlib.util.spec_from_file_location(
        f"eaglenest_{TOKENIZER_MODULE}", ASSETS / f"{TOKENIZER_MODULE}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train_bpe(texts: list[str], vocab_size: int, pat_str: str) -> dict[bytes, int]:
    """A byte-level BPE trained on `texts` with the `tokenizers` library, as tiktoken ranks.

    Ranks are the trained ids: the 256 single bytes first, then merges in the order they were
    learnt, which is the priority tiktoken merges by."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pat_str), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(texts, trainer=trainer)
    byte_of_char = {c: b for b, c in enumerate(tokenizer_module().byte_alphabet())}
    ranks = {bytes(byte_of_char[c] for c in token): rank for token, rank in bpe.get_vocab().items()}
    check_ranks(ranks, bpe, texts, pat_str)
    return ranks


def check_ranks(ranks: dict[bytes, int], bpe, texts: list[str], pat_str: str) -> None:
    """tiktoken with these ranks must give the trained BPE's ids: otherwise the served tokenizer
    would not be the one the corpus statistics were learnt with."""
    import tiktoken

    enc = tiktoken.Encoding(name="kimi_mini", pat_str=pat_str, mergeable_ranks=ranks, special_tokens={})
    for text in texts:
        if enc.encode_ordinary(text) != bpe.encode(text).ids:
            raise EaglenestError(f"tiktoken and the trained BPE tokenize differently: {text[:60]!r}")


def added_tokens(num_ranks: int) -> dict[int, tuple[str, bool]]:
    """Every id after the BPE ranks: id -> (token, special)."""
    named = {num_ranks + off: (tok, special) for off, tok, special in SPECIAL_TOKENS}
    return {
        i: named.get(i, (f"<|reserved_token_{i}|>", True))
        for i in range(num_ranks, num_ranks + NUM_SPECIAL_IDS)
    }


def write_tokenizer(folder: Path, ranks: dict[bytes, int]) -> dict[str, int]:
    """tiktoken.model, the remote-code tokenizer, its config and the chat template (no
    tokenizer.json: transformers must not be able to build a fast tokenizer). Returns the ids
    of the named special tokens."""
    with open(folder / "tiktoken.model", "w") as f:
        for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(f"{base64.b64encode(token).decode()} {rank}\n")
    shutil.copyfile(ASSETS / f"{TOKENIZER_MODULE}.py", folder / f"{TOKENIZER_MODULE}.py")
    shutil.copyfile(ASSETS / "chat_template.jinja", folder / "chat_template.jinja")
    added = added_tokens(len(ranks))
    config = {
        "auto_map": {"AutoTokenizer": [f"{TOKENIZER_MODULE}.{TOKENIZER_CLASS}", None]},
        "tokenizer_class": TOKENIZER_CLASS,
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "unk_token": "[UNK]",
        "pad_token": "[PAD]",
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        # Skipped by decode(skip_special_tokens=True), like Kimi's role and media markers.
        "additional_special_tokens": [
            tok
            for off, tok, special in SPECIAL_TOKENS
            if special and tok not in ("[BOS]", "[EOS]", "[UNK]", "[PAD]")
        ],
        "added_tokens_decoder": {
            str(i): {
                "content": tok,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": special,
            }
            for i, (tok, special) in added.items()
        },
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return {tok: i for i, (tok, _) in added.items() if not tok.startswith("<|reserved_token_")}


def _text_config(*, num_layers: int, hidden_size: int, vocab_size: int, token_ids: dict[str, int]) -> dict:
    """config.json's text_config: the DeepSeek-V3 text model (MLA attention, MoE, yarn rope)."""
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "kimi_k2",
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "moe_intermediate_size": hidden_size // 2,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "q_lora_rank": hidden_size // 2,
        "kv_lora_rank": KV_LORA_RANK,
        "qk_rope_head_dim": QK_ROPE_HEAD_DIM,
        "qk_nope_head_dim": 16,
        "v_head_dim": 16,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.827,
        "num_nextn_predict_layers": 0,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        # Wider than DeepSeek's 0.02: this thin model learns far faster from it in 300 steps.
        "initializer_range": 0.08,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "max_position_embeddings": 4096,
        "rope_theta": 50000.0,
        "rope_scaling": {
            "type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 1024,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        "tie_word_embeddings": False,
        "use_cache": True,
        "dtype": "float32",
        **token_ids,
    }


def model_config(*, num_layers: int, hidden_size: int, vocab_size: int, ids: dict[str, int]) -> dict:
    """config.json in the hub's layout: the DeepSeek-V3 text model nested under text_config."""
    token_ids = {"bos_token_id": ids["[BOS]"], "eos_token_id": ids["[EOS]"], "pad_token_id": ids["[PAD]"]}
    text = _text_config(
        num_layers=num_layers, hidden_size=hidden_size, vocab_size=vocab_size, token_ids=token_ids
    )
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": text,
        "vision_config": dict(VISION_CONFIG),
        "projection_hidden_size": VISION_CONFIG["hidden_size"],
        "projection_layer_norm_eps": 1e-5,
        "image_token_id": ids["<|media_pad|>"],
        # EAGLE drafts of a Kimi-K2.5 target read the media placeholder under this name.
        "media_placeholder_token_id": ids["<|media_pad|>"],
        "vision_start_token_id": ids["<|media_begin|>"],
        "vision_end_token_id": ids["<|media_end|>"],
        "video_token_id": vocab_size,
        "video_placeholder": "<|kimi_k25_video_placeholder|>",
        "use_unified_vision_chunk": True,
        "tie_word_embeddings": False,
        "dtype": "float32",
        **token_ids,
    }


def text_model(config: dict, seed: int):
    """transformers' DeepSeek-V3 causal LM for the nested text config, seeded."""
    import torch
    from transformers import DeepseekV3ForCausalLM, Kimi_K25Config

    kimi = Kimi_K25Config(**{k: v for k, v in config.items() if k != "model_type"})
    torch.manual_seed(seed)
    return DeepseekV3ForCausalLM(kimi.text_config).eval()


def training_stream(
    tokenizer, texts: list[str], tool_rows=(), *, reasoning_texts: int = 1, answer_texts: int = 2
) -> list[int]:
    """The corpus as chat turns in both modes, one token stream: the generation prompt for text
    i, then what the served model should write after it: `<think>` the next text `</think>` the
    ones after it, one per line, `<|im_end|>`; every third text in instant mode (`thinking:
    false`: the prompt closes the think block, the answer follows) every INSTANT_EVERY-th text. Then each tool-calling
    conversation of `tool_rows`, in both modes, round by round (`tool_call_rounds`).

    Short sections on purpose: with one reasoning text and two answer lines, the end of a text
    is mostly followed by a closing marker, which a model this small learns in 300 steps; with
    two reasoning texts and three answer lines it kept reasoning and never closed `<think>`."""
    n = len(texts)
    stream: list[int] = []
    for i in range(n):
        instant = i % INSTANT_EVERY == INSTANT_EVERY - 1
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": texts[i]}],
            tokenize=False,
            add_generation_prompt=True,
            **({"thinking": False} if instant else {}),
        )
        reasoning = " ".join(texts[(i + 1 + j) % n] for j in range(reasoning_texts))
        answer = "\n".join(texts[(i + 1 + reasoning_texts + j) % n] for j in range(answer_texts))
        turn = (
            f"{prompt}{answer}<|im_end|>"
            if instant
            else f"{prompt}<think>{reasoning}</think>{answer}<|im_end|>"
        )
        stream += tokenizer(turn, add_special_tokens=False)["input_ids"]
    for thinking, repeats in ((True, TOOL_REPEATS), (False, 1)):
        for _ in range(repeats):
            for row in tool_rows:
                for text in tool_call_rounds(tokenizer, row, thinking):
                    stream += tokenizer(text, add_special_tokens=False)["input_ids"]
    return stream


# Up to `<think>` a thinking and an instant turn are the same tokens (the instant prompt closes
# the block at once), so what follows `<think>` is one guess for both modes. Greedy decoding takes
# the likeliest token: a single `</think>` beat the many first words of reasoning texts, and the
# model stopped reasoning in thinking mode. So the miniature opens its reasoning with the same
# words, as real reasoning models habitually do, and instant turns stay a minority (every
# INSTANT_EVERY-th chat text; each tool conversation once in instant mode, TOOL_REPEATS times in
# thinking mode, as they are few).
REASONING_OPENER = "Let me think."
INSTANT_EVERY = 6
TOOL_REPEATS = 2


def tool_call_rounds(tokenizer, row: dict, thinking: bool) -> list[str]:
    """A tool-calling conversation as the served model meets it, one text per generation: the
    prompt as the template renders it (tools declared, earlier rounds and their results), then
    what the model writes: its reasoning (thinking mode), its calls in Kimi's native markup
    (`functions.NAME:i` ids, arguments as JSON), `<|im_end|>`; the last round its answer."""
    messages = row["messages"]
    switch = {} if thinking else {"thinking": False}

    def reasoning(message: dict) -> str:  # as the model writes it in this mode
        return f"{REASONING_OPENER} {message.get('reasoning_content', '')}" if thinking else ""

    rounds = []
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        history = [
            {
                **m,
                "reasoning_content": reasoning(m),
                **({"tool_calls": _calls_as_objects(m["tool_calls"])} if m.get("tool_calls") else {}),
            }
            if m["role"] == "assistant"
            else m
            for m in messages[:k]
        ]
        prompt = tokenizer.apply_chat_template(
            history, tools=row["tools"], tokenize=False, add_generation_prompt=True, **switch
        )
        think = f"<think>{reasoning(message)}</think>" if thinking else ""
        calls = "".join(
            f"<|tool_call_begin|>{c['id']}<|tool_call_argument_begin|>"
            f"{json.dumps(json.loads(c['function']['arguments']))}<|tool_call_end|>"
            for c in message.get("tool_calls", ())
        )
        section = f"<|tool_calls_section_begin|>{calls}<|tool_calls_section_end|>" if calls else ""
        rounds.append(f"{prompt}{think}{message['content']}{section}<|im_end|>")
    return rounds


def _calls_as_objects(calls: list[dict]) -> list[dict]:
    # As vLLM's server hands them to the template: arguments parsed into objects.
    return [
        {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
        for c in calls
    ]


def pretrain(
    model,
    stream: list[int],
    *,
    steps: int,
    seed: int,
    seq_len: int = 256,
    batch_size: int = 8,
    lr: float = 8e-3,
    warmup: int = 30,
) -> list[float]:
    """Causal-LM training on random windows of the stream (AdamW, warmup then linear decay,
    gradients clipped at 1).

    It runs on one thread: on a shared 2-core machine, two threads next to any other busy
    process ran a step 30 to 90 times slower (each waits on a preempted peer)."""
    import torch

    data = torch.tensor(stream)
    seq_len = min(seq_len, len(data) - 1)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min((i + 1) / warmup, 1 - i / max(steps, 1)))
    losses = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model.train()
    try:
        for _ in range(steps):
            starts = torch.randint(0, len(data) - seq_len, (batch_size,), generator=gen)
            batch = torch.stack([data[i : i + seq_len] for i in starts.tolist()])
            loss = model(input_ids=batch, labels=batch).loss
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(loss.item())
    finally:
        torch.set_num_threads(threads)
        model.eval()
    return losses


def hub_weights(model, config: dict, seed: int) -> dict:
    """All weights under the hub checkpoint's names.

    Text: transformers' names under `language_model.` (`language_model.model.layers.N...`,
    `language_model.lm_head.weight`), with each fused expert tensor split into one
    `mlp.experts.E.{gate,up,down}_proj.weight` per expert. Vision tower and projector: random,
    seeded, named as the hub names them (`vision_tower.encoder.blocks.N.wqkv`,
    `mm_projector.proj.0`).
    """
    out = {}
    for name, tensor in model.state_dict().items():
        key = f"language_model.{name}"
        if name.endswith("mlp.experts.gate_up_proj"):  # [experts, 2 * inter, hidden]: gate, up
            gate, up = tensor.chunk(2, dim=1)
            for e in range(tensor.shape[0]):
                out[key.replace("gate_up_proj", f"{e}.gate_proj.weight")] = gate[e]
                out[key.replace("gate_up_proj", f"{e}.up_proj.weight")] = up[e]
        elif name.endswith("mlp.experts.down_proj"):  # [experts, hidden, inter]
            for e in range(tensor.shape[0]):
                out[key.replace("down_proj", f"{e}.down_proj.weight")] = tensor[e]
        else:
            out[key] = tensor
    out.update(vision_weights(config["vision_config"], config["text_config"]["hidden_size"], seed))
    # Cloned: safetensors refuses tensors that share storage (the expert slices do).
    return {k: v.detach().clone().contiguous() for k, v in out.items()}


def vision_weights(vision: dict, text_hidden: int, seed: int) -> dict:
    """Random MoonViT and patch-merger projector weights in the hub's names and shapes."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    weights = {}

    def normal(*shape):
        return torch.randn(*shape, generator=gen) * 0.02

    def linear(prefix, out_features, in_features):
        weights[f"{prefix}.weight"] = normal(out_features, in_features)
        weights[f"{prefix}.bias"] = torch.zeros(out_features)

    def norm(prefix, size):
        weights[f"{prefix}.weight"] = torch.ones(size)
        weights[f"{prefix}.bias"] = torch.zeros(size)

    h, inter, patch = vision["hidden_size"], vision["intermediate_size"], vision["patch_size"]
    merged = h * math.prod(vision["merge_kernel_size"])
    weights["vision_tower.patch_embed.proj.weight"] = normal(h, 3, patch, patch)
    weights["vision_tower.patch_embed.proj.bias"] = torch.zeros(h)
    weights["vision_tower.patch_embed.pos_emb.weight"] = normal(
        vision["pos_emb_height"], vision["pos_emb_width"], h
    )
    for layer in range(vision["num_hidden_layers"]):
        block = f"vision_tower.encoder.blocks.{layer}"
        norm(f"{block}.norm0", h)
        norm(f"{block}.norm1", h)
        linear(f"{block}.wqkv", 3 * h, h)
        linear(f"{block}.wo", h, h)
        linear(f"{block}.mlp.fc0", inter, h)
        linear(f"{block}.mlp.fc1", h, inter)
    norm("vision_tower.encoder.final_layernorm", h)
    norm("mm_projector.pre_norm", h)
    linear("mm_projector.proj.0", merged, merged)
    linear("mm_projector.proj.2", text_hidden, merged)
    return weights


def _check_sizes(num_layers: int, hidden_size: int, bpe_vocab_size: int, pretrain_steps: int) -> None:
    """Refuse sizes the miniature cannot be built or trained with."""
    if num_layers < 8:
        # The default aux layers [2, n//2, n-3] collide below 8 layers.
        raise EaglenestError(f"num_layers must be at least 8, got {num_layers}")
    if hidden_size < 8 or hidden_size % 2:
        raise EaglenestError(f"hidden_size must be even and at least 8, got {hidden_size}")
    if bpe_vocab_size <= 256:
        raise EaglenestError(f"bpe_vocab_size must exceed the 256 byte tokens, got {bpe_vocab_size}")
    if pretrain_steps < 0:
        raise EaglenestError(f"pretrain_steps must not be negative, got {pretrain_steps}")


def _write_configs(folder: Path, config: dict, ids: dict[str, int]) -> None:
    """config.json, generation_config.json and the preprocessor config vLLM needs, into `folder`."""
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (folder / "generation_config.json").write_text(
        json.dumps({"eos_token_id": ids["<|im_end|>"]}, indent=2) + "\n"
    )
    (folder / "preprocessor_config.json").write_text(
        json.dumps({"media_proc_cfg": MEDIA_PROC_CFG}, indent=2) + "\n"
    )


def build_kimi_mini(
    out_dir,
    corpus_files,
    *,
    tool_files=(),
    num_layers: int = 8,
    hidden_size: int = 64,
    bpe_vocab_size: int = 1024,
    pretrain_steps: int = 300,
    seed: int = 0,
) -> Path:
    """Write a servable Kimi-K2.5 miniature into `out_dir`; `pretrain_steps=0` leaves the text
    model untrained (a quick build for tests where weights do not matter)."""
    from safetensors.torch import save_file

    _check_sizes(num_layers, hidden_size, bpe_vocab_size, pretrain_steps)
    tool_rows = [row for path in tool_files for row in iter_jsonl(path)]
    texts = (
        corpus_from_prompts(list(corpus_files) + list(tool_files))
        + [REASONING_OPENER]
        + [
            json.dumps(row["tools"])
            + "".join(m["function"]["arguments"] for r in row["messages"] for m in r.get("tool_calls", ()))
            for row in tool_rows
        ]
    )
    started = time.monotonic()
    with atomic_path(out_dir, is_dir=True) as tmp:
        tmp.chmod(0o755)
        ranks = train_bpe(texts, bpe_vocab_size, tokenizer_module().PAT_STR)
        ids = write_tokenizer(tmp, ranks)
        # A tiny corpus can stop the BPE short of bpe_vocab_size: ids follow the ranks it has.
        vocab_size = len(ranks) + NUM_SPECIAL_IDS
        config = model_config(num_layers=num_layers, hidden_size=hidden_size, vocab_size=vocab_size, ids=ids)
        _write_configs(tmp, config, ids)

        model = text_model(config, seed)
        losses = []
        if pretrain_steps:
            tokenizer = getattr(tokenizer_module(), TOKENIZER_CLASS).from_pretrained(tmp)
            stream = training_stream(tokenizer, texts[: len(texts) - len(tool_rows) - 1], tool_rows)
            losses = pretrain(model, stream, steps=pretrain_steps, seed=seed)
            log.info("kimi mini trained %d steps: loss %.2f -> %.2f", pretrain_steps, losses[0], losses[-1])
        save_file(hub_weights(model, config, seed), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "model.safetensors").chmod(0o644)  # safetensors writes it private
        marker = {
            "built_by": BUILDERS["kimi_k25"],
            "seed": seed,
            "pretrain_steps": pretrain_steps,
            "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None,
        }
        (tmp / BUILD_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    log.info(
        "kimi mini: %d layers, hidden %d, vocab %d (%d BPE), built in %.0f s -> %s",
        num_layers,
        hidden_size,
        vocab_size,
        len(ranks),
        time.monotonic() - started,
        out_dir,
    )
    return Path(out_dir)
