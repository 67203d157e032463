"""Tests for the Kimi-K2.5 miniature: what the pipeline relies on when it serves it as the seed
case's stand-in (remote-code tiktoken tokenizer, nested config, hub weight names, Kimi's
thinking template). Untrained builds (pretrain_steps=0): the weights' values do not matter here."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import json
import re
from pathlib import Path

import pytest
import torch

from eaglenest.core.errors import EaglenestError
from eaglenest.target.kimi_mini import (
    ASSETS,
    REASONING_OPENER,
    SPECIAL_TOKENS,
    build_kimi_mini,
    text_model,
    tokenizer_module,
    tool_call_rounds,
)

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "data" / "tiny_target" / "corpus.jsonl"
NUM_LAYERS = 8

UNICODE_TEXTS = [
    "Héllo wörld — “quotes”, façade, naïve",
    "中文字符和日本語のテキスト, 한국어",
    "emoji 🙂👍🏽 and combining e\u0301 marks",
    "  leading spaces, tabs\t\tand\nnew\r\nlines\n\n",
    "numbers 1234567 and code: if x != y: return {'a': [1, 2]}",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """One untrained build for the module; remote code is copied into a scratch modules cache,
    never into ~/.cache."""
    import transformers.dynamic_module_utils as dmu

    modules = tmp_path_factory.mktemp("hf_modules")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_MODULES_CACHE", str(modules))
        mp.setattr(dmu, "HF_MODULES_CACHE", str(modules))
        out = tmp_path_factory.mktemp("kimi") / "model"
        yield build_kimi_mini(out, [CORPUS], num_layers=NUM_LAYERS, pretrain_steps=0)


@pytest.fixture(scope="module")
def tok(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir, trust_remote_code=True)


def test_folder_is_laid_out_like_the_hub(model_dir):
    names = {p.name for p in model_dir.iterdir()}
    assert {
        "config.json",
        "generation_config.json",
        "preprocessor_config.json",
        "model.safetensors",
        "tiktoken.model",
        "tokenization_kimi_mini.py",
        "tokenizer_config.json",
        "chat_template.jinja",
    } <= names
    # Without tokenizer.json transformers cannot build a fast tokenizer: only the remote code loads.
    assert "tokenizer.json" not in names
    cfg = json.loads((model_dir / "tokenizer_config.json").read_text())
    assert cfg["auto_map"]["AutoTokenizer"] == ["tokenization_kimi_mini.TikTokenTokenizer", None]
    shipped = (ASSETS / "chat_template.jinja").read_text()
    assert (model_dir / "chat_template.jinja").read_text() == shipped


def test_remote_code_tokenizer_loads_offline_and_is_slow(tok):
    assert type(tok).__name__ == "TikTokenTokenizer"
    assert type(tok).__module__.startswith("transformers_modules.")
    assert not tok.is_fast


@pytest.mark.parametrize("text", UNICODE_TEXTS)
def test_unicode_round_trips_with_tiktoken_ids(tok, model_dir, text):
    import tiktoken

    ids = tok(text, add_special_tokens=False).input_ids
    assert tok.decode(ids) == text
    # The transformers wrapper adds nothing to tiktoken's BPE with Kimi's split pattern.
    module = tokenizer_module()
    enc = tiktoken.Encoding(
        name="check",
        pat_str=module.PAT_STR,
        special_tokens={},
        mergeable_ranks=module.load_ranks(model_dir / "tiktoken.model"),
    )
    assert ids == enc.encode_ordinary(text)


def test_special_tokens_are_single_ids_after_the_bpe_ranks(tok):
    ids = {}
    for _, token, _ in SPECIAL_TOKENS:
        encoded = tok(token, add_special_tokens=False).input_ids
        assert encoded == [tok.convert_tokens_to_ids(token)], token
        ids[token] = encoded[0]
    assert min(ids.values()) == tok.vocab_size  # right after the BPE ranks, as in Kimi
    text = "<|im_user|>user<|im_middle|>hi<|im_end|><think>x</think>"
    encoded = tok(text, add_special_tokens=False).input_ids
    assert [ids["<|im_user|>"], ids["<|im_middle|>"], ids["<|im_end|>"], ids["<think>"], ids["</think>"]] == [
        i for i in encoded if i >= tok.vocab_size
    ]
    # Like Kimi's tokenizer: no BOS or EOS added, the template alone decides the tokens.
    assert tok("hi").input_ids == tok("hi", add_special_tokens=False).input_ids
    # Role markers disappear from skip_special_tokens decodes; reasoning markers stay for parsers.
    assert tok.decode(encoded, skip_special_tokens=True) == "userhi<think>x</think>"


def test_config_nests_an_mla_moe_text_model_covering_every_id(model_dir, tok):
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(model_dir)
    assert cfg.model_type == "kimi_k25"
    text = cfg.text_config
    assert text.num_hidden_layers == NUM_LAYERS
    assert text.kv_lora_rank + text.qk_rope_head_dim == 576  # all vLLM's CPU MLA kernel accepts
    assert text.q_lora_rank and text.n_routed_experts > text.num_experts_per_tok > 0
    assert text.n_shared_experts >= 1 and text.first_k_dense_replace == 1
    assert not cfg.tie_word_embeddings and not text.tie_word_embeddings
    assert max(tok.get_vocab().values()) < text.vocab_size == len(tok)
    media_pad = tok.convert_tokens_to_ids("<|media_pad|>")
    assert cfg.image_token_id == cfg.media_placeholder_token_id == media_pad
    raw = json.loads((model_dir / "config.json").read_text())
    assert raw["architectures"] == ["KimiK25ForConditionalGeneration"]
    assert raw["text_config"]["model_type"] == "kimi_k2"  # the hub's spelling
    generation = json.loads((model_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == tok.convert_tokens_to_ids("<|im_end|>")


def test_weights_load_losslessly_in_transformers_kimi_k25(model_dir):
    """transformers converts the hub's names on load (per-expert tensors fused, vision renamed):
    nothing missing or left over, and the language model computes what was built."""
    from transformers import Kimi_K25ForConditionalGeneration

    model, info = Kimi_K25ForConditionalGeneration.from_pretrained(
        model_dir, output_loading_info=True, dtype=torch.float32
    )
    assert not any(info.values()), info
    config = json.loads((model_dir / "config.json").read_text())
    built = text_model(config, seed=0)  # the seeded untrained text model the build exported
    ids = torch.tensor([[5, 300, 17, 900, 1041, 1046]])
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, built(input_ids=ids).logits)


def test_weight_names_are_the_hub_names_vllm_loads(model_dir):
    """The names vLLM's KimiK25ForConditionalGeneration loads (vllm/model_executor/models/
    kimi_k25.py, kimi_k25_vit.py, deepseek_v2.py): the language model under language_model.,
    experts one tensor per expert and projection (fused into FusedMoE by the loader), the vision
    tower with fused wqkv, the projector as proj.0/proj.2 (mapped to linear_1/linear_2)."""
    from safetensors import safe_open

    with safe_open(model_dir / "model.safetensors", "pt") as f:
        names = set(f.keys())
    config = json.loads((model_dir / "config.json").read_text())["text_config"]
    moe_layers = range(config["first_k_dense_replace"], NUM_LAYERS)
    experts = {
        f"language_model.model.layers.{layer}.mlp.experts.{e}.{proj}.weight"
        for layer in moe_layers
        for e in range(config["n_routed_experts"])
        for proj in ("gate_proj", "up_proj", "down_proj")
    }
    assert experts <= names
    assert {
        "language_model.model.embed_tokens.weight",
        "language_model.model.norm.weight",
        "language_model.lm_head.weight",
        "vision_tower.encoder.blocks.0.wqkv.weight",
        "vision_tower.patch_embed.pos_emb.weight",
        "mm_projector.proj.0.weight",
        "mm_projector.proj.2.weight",
        "mm_projector.pre_norm.weight",
    } <= names
    allowed = re.compile(
        r"language_model\.(model\.(embed_tokens|norm|layers\.\d+)\.|lm_head\.)"
        r"|vision_tower\.(patch_embed|encoder)\."
        r"|mm_projector\.(pre_norm|proj\.[02])\."
    )
    assert all(allowed.match(n) for n in names), sorted(n for n in names if not allowed.match(n))
    # transformers-internal spellings vLLM would not load
    assert not any(
        "gate_up_proj" in n or "language_model.model.blocks" in n or n.startswith("model.") for n in names
    )
    for layer in moe_layers:
        assert f"language_model.model.layers.{layer}.mlp.gate.e_score_correction_bias" in names
        assert f"language_model.model.layers.{layer}.mlp.shared_experts.down_proj.weight" in names
    assert "language_model.model.layers.0.mlp.down_proj.weight" in names  # the dense first layer


def test_chat_template_thinks_like_kimi(tok):
    """Kimi-K2-Thinking's template, unchanged: the generation prompt leaves <think> to the
    model; assistant turns up to the last one without tool calls keep only an empty
    <think></think>; a tool-calling turn after it keeps its reasoning."""
    conv = [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "add them"},
        {"role": "user", "content": "And 3+3?"},
    ]
    prompt = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    # The default system prompt comes first: the provenance header renders nothing.
    assert prompt.startswith("<|im_system|>system<|im_middle|>")
    assert prompt.endswith("<|im_end|><|im_assistant|>assistant<|im_middle|>")
    assert "<|im_assistant|>assistant<|im_middle|><think></think>4<|im_end|>" in prompt
    assert "add them" not in prompt

    finished = [*conv, {"role": "assistant", "content": "6", "reasoning_content": "again"}]
    rendered = tok.apply_chat_template(finished, tokenize=False)
    assert rendered.endswith("<|im_assistant|>assistant<|im_middle|><think></think>6<|im_end|>")

    calling = [
        *conv,
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "use the tool",
            "tool_calls": [
                {
                    "id": "functions.add:0",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 3}'},
                }
            ],
        },
    ]
    rendered = tok.apply_chat_template(calling, tokenize=False)
    assert "<think>use the tool</think><|tool_calls_section_begin|><|tool_call_begin|>" in rendered


def test_instant_mode_closes_the_think_block_in_the_generation_prompt(tok):
    """Kimi-K2.5's `thinking` switch: off, the generation prompt opens and closes the think
    block, so the answer follows at once; on or absent, the model opens it."""
    conv = [{"role": "user", "content": "Hi"}]
    instant = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True, thinking=False)
    assert instant.endswith("<|im_assistant|>assistant<|im_middle|><think></think>")
    for switch in ({}, {"thinking": True}):
        prompt = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True, **switch)
        assert prompt.endswith("<|im_assistant|>assistant<|im_middle|>")


def test_the_tool_corpus_is_written_in_kimis_native_markup(tok):
    """What the miniature learns to write for a tools row: reasoning in thinking mode, the calls
    with their native ids and arguments as the engine re-renders them, the end of turn; the
    second round's prompt holds the first round's answer as the template renders history."""
    row = json.loads((REPO / "data" / "prompts" / "kimi_mini_tools.jsonl").read_text().splitlines()[0])
    first, second = tool_call_rounds(tok, row, thinking=True)
    call = row["messages"][1]["tool_calls"][0]
    written = (
        f"<think>{REASONING_OPENER} {row['messages'][1]['reasoning_content']}</think>"
        f"<|tool_calls_section_begin|><|tool_call_begin|>{call['id']}<|tool_call_argument_begin|>"
        f"{json.dumps(json.loads(call['function']['arguments']))}<|tool_call_end|><|tool_calls_section_end|><|im_end|>"
    )
    assert first.endswith("<|im_assistant|>assistant<|im_middle|>" + written)
    assert "<|im_system|>tool_declare<|im_middle|>" in first
    assert written in second and f"## Return of {call['id']}" in second
    instant = tool_call_rounds(tok, row, thinking=False)[0]
    assert instant.endswith(
        "<think></think><|tool_calls_section_begin|>" + written.split("<|tool_calls_section_begin|>")[1]
    )


def test_a_recorded_answer_is_placed_in_its_reasoning_and_tool_call_spans(tok):
    """vLLM's own body for the miniature's trained draft answering a tools prompt in thinking
    mode (detailed per-step metrics): its served ids, labelled with the miniature's tokenizer as
    tokenize's mask labels them, hold reasoning up to </think> (as many tokens as vLLM's own
    reasoning count, with both tags) then the call section; every step is placed."""
    from eaglenest.evaluation.spans import SpanLabeller, response_spans

    recorded = json.loads(
        (Path(__file__).parent / "data" / "vllm_chat_response_kimi_mini_spans.json").read_text()
    )
    ids = recorded["choices"][0]["token_ids"]
    spec = recorded["metrics"]["speculative_decoding"]
    kinds = SpanLabeller(tok).kinds(ids)
    close = ids.index(tok.convert_tokens_to_ids("</think>"))
    section = ids.index(tok.convert_tokens_to_ids("<|tool_calls_section_begin|>"))
    assert kinds == ["reasoning"] * (close + 1) + ["answer"] * (section - close - 1) + ["tool_call"] * (
        len(ids) - section
    )
    # vLLM counts the reasoning between the tags; the answer opened its block itself.
    assert ids[0] == tok.convert_tokens_to_ids("<think>")
    assert recorded["usage"]["completion_tokens_details"]["reasoning_tokens"] == close - 1
    spans = response_spans(kinds, spec)
    assert sum(s["tokens"] for s in spans.values()) == len(ids)
    assert sum(s["steps"] for s in spans.values()) == 1 + spec["num_spec_steps"]
    assert sum(s["accepted_tokens"] for s in spans.values()) == spec["num_accepted_draft_tokens"]
    assert spans["reasoning"]["steps"] >= 1 and spans["tool_call"]["steps"] >= 1


def test_rejects_bad_input(tmp_path):
    with pytest.raises(EaglenestError, match="num_layers must be at least 8, got 4"):
        build_kimi_mini(tmp_path / "m", [CORPUS], num_layers=4, pretrain_steps=0)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(
        EaglenestError, match=f"^{re.escape(str(empty))}: no text to train the tiny tokenizer on$"
    ):
        build_kimi_mini(tmp_path / "m", [empty], pretrain_steps=0)
    assert not (tmp_path / "m").exists()
