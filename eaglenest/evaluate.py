"""Measure acceptance in vLLM: the number a user cares about.

On the held-out prompts, greedy, vLLM serves the target four ways: no speculation, n-gram
speculation, an untrained draft (the floor) and the trained draft, each with the same
`num_speculative_tokens`. Acceptance comes from vLLM's own spec-decode counters (`/metrics`,
read before and after, so only this run's requests count). Speculation must be lossless: each
method's greedy outputs are compared with those of no speculation.
"""

from __future__ import annotations

import json
import logging
import re
import time
import urllib.request
from pathlib import Path

import torch

from eaglenest.io import iter_jsonl
from eaglenest.server import SERVED_NAME, Server, ServerSpec

log = logging.getLogger(__name__)

METHODS = ("no_spec", "ngram", "untrained_draft", "draft")
_METRIC = re.compile(r'^(vllm:spec_decode_[a-z_]+?)(?:_total)?(\{[^}]*\})?\s+([0-9.eE+-]+)$')


def method_spec(method: str, target: str, base_args: tuple, env: tuple, *, k: int,
                draft_dir=None, ngram: dict | None = None) -> ServerSpec:
    args = list(base_args)
    if method == "ngram":
        ngram = ngram or {}
        args += ["--speculative-config", json.dumps({
            "method": "ngram", "num_speculative_tokens": k,
            "prompt_lookup_min": ngram.get("prompt_lookup_min", 2),
            "prompt_lookup_max": ngram.get("prompt_lookup_max", 4)})]
    elif method in ("draft", "untrained_draft"):
        args += ["--speculative-config", json.dumps({
            "method": "eagle3", "model": str(Path(draft_dir).resolve()),
            "num_speculative_tokens": k})]
    elif method != "no_spec":
        raise ValueError(f"unknown method {method}")
    return ServerSpec(model=target, args=tuple(args), env=env)


def read_spec_metrics(server: Server) -> dict:
    """vLLM's spec-decode counters: totals and accepted tokens per draft position."""
    text = urllib.request.urlopen(f"{server.base_url}/metrics", timeout=10).read().decode()
    out: dict = {"per_pos": {}}
    for line in text.splitlines():
        m = _METRIC.match(line.strip())
        if not m or line.startswith("#"):
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if name.endswith("_created"):
            continue
        pos = re.search(r'position="(\d+)"', labels)
        if name == "vllm:spec_decode_num_accepted_tokens_per_pos" and pos:
            out["per_pos"][int(pos.group(1))] = out["per_pos"].get(int(pos.group(1)), 0) + value
        else:
            out[name.removeprefix("vllm:spec_decode_")] = out.get(
                name.removeprefix("vllm:spec_decode_"), 0) + value
    return out


def acceptance_from_counters(before: dict, after: dict, k: int) -> dict:
    drafts = after.get("num_drafts", 0) - before.get("num_drafts", 0)
    draft_tokens = after.get("num_draft_tokens", 0) - before.get("num_draft_tokens", 0)
    accepted = after.get("num_accepted_tokens", 0) - before.get("num_accepted_tokens", 0)
    per_pos = [after["per_pos"].get(i, 0) - before["per_pos"].get(i, 0) for i in range(k)]
    if drafts <= 0:
        return {"num_drafts": 0, "mean_acceptance_length": 1.0, "acceptance_rate": 0.0,
                "per_position_acceptance": [0.0] * k}
    return {
        "num_drafts": int(drafts),
        "num_draft_tokens": int(draft_tokens),
        "num_accepted_tokens": int(accepted),
        # Each target step yields the accepted draft tokens plus the one the target adds.
        "mean_acceptance_length": 1.0 + accepted / drafts,
        "acceptance_rate": accepted / draft_tokens if draft_tokens else 0.0,
        "per_position_acceptance": [a / drafts for a in per_pos],
    }


def generate(server: Server, prompts: list[dict], max_tokens: int, concurrency: int):
    """Greedy completions (token ids and text) for every prompt; returns (outputs, seconds)."""
    from concurrent.futures import ThreadPoolExecutor

    import openai

    client = openai.OpenAI(base_url=server.api_url, api_key="EMPTY", max_retries=2, timeout=600)

    def one(p):
        r = client.chat.completions.create(
            model=SERVED_NAME, messages=p["messages"], max_tokens=max_tokens, temperature=0.0,
            extra_body={"return_token_ids": True, "ignore_eos": False})
        c = r.choices[0]
        ids = (c.model_extra or {}).get("token_ids")
        return {"id": p["id"], "text": c.message.content or "", "token_ids": ids,
                "completion_tokens": r.usage.completion_tokens}

    t0 = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        outs = list(pool.map(one, prompts))
    return outs, time.monotonic() - t0


def evaluate_method(server: Server, prompts: list[dict], *, k: int, max_tokens: int,
                    concurrency: int, spec_decoding: bool) -> tuple[dict, list[dict]]:
    before = read_spec_metrics(server) if spec_decoding else None
    outs, seconds = generate(server, prompts, max_tokens, concurrency)
    tokens = sum(o["completion_tokens"] for o in outs)
    if spec_decoding:
        result = acceptance_from_counters(before, read_spec_metrics(server), k)
    else:
        result = {"num_drafts": 0, "mean_acceptance_length": 1.0, "acceptance_rate": None,
                  "per_position_acceptance": None}
    result.update({"output_tokens": tokens, "seconds": round(seconds, 3),
                   "output_tokens_per_s": round(tokens / seconds, 2) if seconds else None})
    return result, outs


def lossless(reference: list[dict], outs: list[dict]) -> tuple[bool, list[str]]:
    """Greedy speculation must reproduce the outputs without it, token for token."""
    differ = [o["id"] for r, o in zip(reference, outs, strict=True)
              if (r["token_ids"], r["text"]) != (o["token_ids"], o["text"])]
    return not differ, differ


def make_untrained_draft(trained_dir, out_dir, seed: int = 0) -> Path:
    """The floor: the trained checkpoint's config, vocabulary mapping and (frozen, target-owned)
    embeddings with fresh trainable weights."""
    import shutil

    from safetensors.torch import load_file, save_file

    from eaglenest.io import atomic_path

    with atomic_path(out_dir, is_dir=True) as tmp:
        for f in Path(trained_dir).iterdir():
            if f.suffix == ".json" and f.name == "config.json":
                shutil.copy(f, tmp / f.name)
        gen = torch.Generator().manual_seed(seed)
        weights = load_file(str(Path(trained_dir) / "model.safetensors"))
        fresh = {}
        for name, w in weights.items():
            if name in ("d2t", "t2d") or "embed_tokens" in name or not w.is_floating_point():
                fresh[name] = w
            elif "norm" in name:
                fresh[name] = torch.ones_like(w)
            else:
                fresh[name] = (torch.randn(w.shape, generator=gen) * 0.02).to(w.dtype)
        save_file(fresh, str(tmp / "model.safetensors"))
    return Path(out_dir)


def load_eval_prompts(path) -> list[dict]:
    return [{"id": r["id"], "messages": r["messages"]} for r in iter_jsonl(path)]
