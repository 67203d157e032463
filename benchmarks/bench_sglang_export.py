"""The SGLang export at a draft's real shape: seconds, peak memory and the checks' figures.

A draft is made by speculators' own `Eagle3DraftModel` at the chosen shape (`--shape kimi`:
Kimi-K2.5's, hidden 7,168, 64 heads, vocabulary 163,840, draft vocabulary 32,000, YaRN rope; the
shapes of benchmarks/bench_gpu_training.py), random weights in bfloat16 as the trainer saves
them, and exported by `export_draft_sglang`'s function for a target of the given architecture.
Prints the export's seconds, the process's peak resident memory, and each check: keys (SGLang's
loader replayed: parameters filled, keys skipped), config, and parity (eaglenest's restatement of
SGLang's forward against speculators' draft: largest relative logit and state error, the
tolerance, argmax agreement).

Usage: python benchmarks/bench_sglang_export.py [--shape kimi|tiny] [--target-architecture A]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import load_file, save_file

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_gpu_training import SHAPES  # noqa: E402 -- the shapes live beside this benchmark

from eaglenest.evaluation.sglang_export import export_sglang_stage  # noqa: E402

ARCHITECTURE = {"kimi": "KimiK25ForConditionalGeneration", "tiny": "LlamaForCausalLM"}


def make_draft(folder: Path, shape: dict) -> Path:
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig

    n, hidden, heads = shape["num_hidden_layers"], shape["hidden_size"], shape["num_attention_heads"]
    layer = LlamaConfig(
        vocab_size=shape["vocab_size"], hidden_size=hidden, intermediate_size=shape["intermediate_size"],
        num_hidden_layers=1, num_attention_heads=heads, num_key_value_heads=shape["num_key_value_heads"],
        head_dim=hidden // heads, rms_norm_eps=shape["rms_norm_eps"],
        max_position_embeddings=shape["max_position_embeddings"], rope_parameters=dict(shape["rope_parameters"]),
    )  # fmt: skip
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer,
        draft_vocab_size=shape["draft_vocab_size"],
        norm_before_residual=False,
        norm_before_fc=True,
        norm_output=True,
        eagle_aux_hidden_state_layer_ids=[2, n // 2, n - 3],
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path="target", architectures=["LlamaForCausalLM"]),
        ),
    )
    with torch.device("meta"):
        model = Eagle3DraftModel(config)
    g = torch.Generator().manual_seed(0)
    state = {}
    for name, p in model.named_parameters():
        if name.startswith("verifier_"):
            continue
        base = torch.ones(p.shape) if p.dim() == 1 else torch.zeros(p.shape)
        scale = 0.1 if p.dim() == 1 else p.shape[-1] ** -0.5
        state[name] = (base + torch.randn(p.shape, generator=g) * scale).to(torch.bfloat16)
    vocab, draft_vocab = shape["vocab_size"], shape["draft_vocab_size"]
    kept = torch.randperm(vocab, generator=g)[:draft_vocab].sort().values
    state["t2d"] = torch.zeros(vocab, dtype=torch.bool).index_fill_(0, kept, True)
    state["d2t"] = kept - torch.arange(draft_vocab)
    folder.mkdir(parents=True)
    save_file(state, str(folder / "model.safetensors"))
    config.save_pretrained(str(folder))
    return folder


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="kimi")
    ap.add_argument(
        "--target-architecture", default=None, help="default: Kimi-K2.5's for kimi, Llama's for tiny"
    )
    args = ap.parse_args()
    shape = SHAPES[args.shape]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        draft = make_draft(tmp / "draft", shape)
        made = time.perf_counter() - t0
        target = tmp / "target"
        target.mkdir()
        tcfg = {k: shape[k] for k in ("hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "rms_norm_eps")}  # fmt: skip
        tcfg["architectures"] = [args.target_architecture or ARCHITECTURE[args.shape]]
        (target / "config.json").write_text(json.dumps(tcfg))
        t0 = time.perf_counter()
        record = export_sglang_stage(
            draft,
            tmp / "draft_sglang",
            target=SimpleNamespace(path=str(target), name="target", hub_id=None, commit=None),
        )
        seconds = time.perf_counter() - t0
        size = sum(f.stat().st_size for f in (tmp / "draft_sglang").iterdir())
        keys = len(load_file(str(tmp / "draft_sglang" / "model.safetensors")))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kB -> GB
    checks = record["checks"]
    print(
        f"shape {args.shape}: hidden {shape['hidden_size']}, vocabulary {shape['vocab_size']:,}, draft vocabulary {shape['draft_vocab_size']:,}, rope {shape['rope_parameters']['rope_type']}; target {tcfg['architectures'][0]}"
    )
    print(
        f"draft made in {made:.1f} s; export {seconds:.1f} s, {size / 1e9:.2f} GB written ({keys} tensors); peak resident memory {peak:.1f} GB"
    )
    print(
        f"keys: ok {checks['keys']['ok']}, {checks['keys']['parameters']} parameters filled, skipped {checks['keys']['skipped']}, missing {checks['keys']['missing']}"
    )
    print(f"config: ok {checks['config']['ok']} {checks['config']['problems']}")
    p = checks["parity"]
    print(
        f"parity: ok {p['ok']}, logits {p.get('max_relative_logit_error', float('nan')):.2e}, "
        f"state {p.get('max_relative_state_error', float('nan')):.2e} (tolerance {p.get('tolerance')}), "
        f"same argmax {p.get('same_argmax')} on {p.get('tokens')} tokens"
    )  # fmt: skip
    return 0 if all(c["ok"] for c in checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
