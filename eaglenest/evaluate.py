"""Measure acceptance in vLLM: the number a user cares about.

On the held-out prompts, greedy, vLLM serves the target four ways: no speculation, n-gram
speculation, an untrained draft (the floor) and the trained draft, each with the same
`num_speculative_tokens`. Acceptance comes from vLLM's own spec-decode counters (`/metrics`,
read before and after, so only this run's requests count). Speculation must be lossless: each
method's greedy outputs are compared with those of no speculation. A sweep's variant serves its
trained draft alone and is compared with the run's own no-speculation outputs.
"""

from __future__ import annotations

import json
import logging
import re
import time
import urllib.request
from pathlib import Path

from eaglenest.io import iter_jsonl
from eaglenest.server import SERVED_NAME, Server, ServerError, ServerSpec, StallWatch

log = logging.getLogger(__name__)

METHODS = ("no_spec", "ngram", "untrained_draft", "draft")
_METRIC = re.compile(r"^(vllm:spec_decode_[a-z_]+?)(?:_total)?(\{[^}]*\})?\s+([0-9.eE+-]+)$")


def method_spec(
    method: str,
    target: str,
    base_args: tuple,
    env: tuple,
    *,
    k: int,
    draft_dir=None,
    ngram: dict | None = None,
) -> ServerSpec:
    args = list(base_args)
    if method == "ngram":
        ngram = ngram or {}
        args += [
            "--speculative-config",
            json.dumps(
                {
                    "method": "ngram",
                    "num_speculative_tokens": k,
                    "prompt_lookup_min": ngram.get("prompt_lookup_min", 2),
                    "prompt_lookup_max": ngram.get("prompt_lookup_max", 4),
                }
            ),
        ]
    elif method in ("draft", "untrained_draft"):
        args += [
            "--speculative-config",
            json.dumps(
                {"method": "eagle3", "model": str(Path(draft_dir).resolve()), "num_speculative_tokens": k}
            ),
        ]
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
            out[name.removeprefix("vllm:spec_decode_")] = (
                out.get(name.removeprefix("vllm:spec_decode_"), 0) + value
            )
    return out


def acceptance_from_counters(before: dict, after: dict, k: int) -> dict:
    drafts = after.get("num_drafts", 0) - before.get("num_drafts", 0)
    draft_tokens = after.get("num_draft_tokens", 0) - before.get("num_draft_tokens", 0)
    accepted = after.get("num_accepted_tokens", 0) - before.get("num_accepted_tokens", 0)
    per_pos = [after["per_pos"].get(i, 0) - before["per_pos"].get(i, 0) for i in range(k)]
    if drafts <= 0:
        return {
            "num_drafts": 0,
            "mean_acceptance_length": 1.0,
            "acceptance_rate": 0.0,
            "per_position_acceptance": [0.0] * k,
        }
    return {
        "num_drafts": int(drafts),
        "num_draft_tokens": int(draft_tokens),
        "num_accepted_tokens": int(accepted),
        # Each target step yields the accepted draft tokens plus the one the target adds.
        "mean_acceptance_length": 1.0 + accepted / drafts,  # vLLM's definition: per draft
        "acceptance_rate": accepted / draft_tokens if draft_tokens else 0.0,
        "per_position_acceptance": [a / drafts for a in per_pos],
    }


def generate(server: Server, prompts: list[dict], max_tokens: int, concurrency: int, stall_timeout_s: float):
    """Greedy completions (token ids and text) for every prompt; returns (outputs, seconds).
    Every prompt must be answered (the methods are compared prompt by prompt): a request that
    fails twice, or a server silent for `stall_timeout_s`, fails the stage."""
    from concurrent.futures import ThreadPoolExecutor

    import openai

    client = openai.OpenAI(
        base_url=server.api_url, api_key=server.client_key, max_retries=1, timeout=stall_timeout_s
    )
    watch = StallWatch(server, stall_timeout_s)

    def one(p):
        try:
            r = client.chat.completions.create(
                model=SERVED_NAME,
                messages=p["messages"],
                max_tokens=max_tokens,
                temperature=0.0,
                extra_body={"return_token_ids": True, "ignore_eos": False},
            )
        except openai.APIError as e:
            watch.check(e)
            raise ServerError(f"prompt {p['id']}: the server failed it twice: {e}", server.log_path) from e
        watch.answered()
        c = r.choices[0]
        ids = (c.model_extra or {}).get("token_ids")
        return {
            "id": p["id"],
            "text": c.message.content or "",
            "token_ids": ids,
            "completion_tokens": r.usage.completion_tokens,
        }

    t0 = time.monotonic()
    pool = ThreadPoolExecutor(concurrency)
    try:
        outs = list(pool.map(one, prompts))
    finally:  # on a failure, fail now: queued prompts are dropped, not sent to a hung server
        pool.shutdown(wait=False, cancel_futures=True)
    return outs, time.monotonic() - t0


def evaluate_method(
    server: Server,
    prompts: list[dict],
    *,
    k: int,
    max_tokens: int,
    concurrency: int,
    spec_decoding: bool,
    stall_timeout_s: float,
) -> tuple[dict, list[dict]]:
    before = read_spec_metrics(server) if spec_decoding else None
    outs, seconds = generate(server, prompts, max_tokens, concurrency, stall_timeout_s)
    tokens = sum(o["completion_tokens"] for o in outs)
    if spec_decoding:
        result = acceptance_from_counters(before, read_spec_metrics(server), k)
    else:
        result = {
            "num_drafts": 0,
            "mean_acceptance_length": 1.0,
            "acceptance_rate": None,
            "per_position_acceptance": None,
        }
    result.update(
        {
            "output_tokens": tokens,
            "seconds": round(seconds, 3),
            "output_tokens_per_s": round(tokens / seconds, 2) if seconds else None,
        }
    )
    # vLLM's figure averages over the steps that drafted; n-gram drafts only where it finds a
    # match. Tokens per target step over ALL steps is what a user gets, so that is the headline
    # `mean_acceptance_length`; vLLM's own figure stays as `..._per_draft`. Every target step
    # yields one token of its own plus the drafts it accepted.
    accepted = result.get("num_accepted_tokens", 0)
    result["mean_acceptance_length_per_draft"] = result["mean_acceptance_length"]
    result["mean_acceptance_length"] = tokens / (tokens - accepted) if tokens > accepted else 1.0
    return result, outs


def lossless(reference: list[dict], outs: list[dict]) -> tuple[bool, list[str]]:
    """Greedy speculation must reproduce the outputs without it, token for token."""
    differ = [
        o["id"]
        for r, o in zip(reference, outs, strict=True)
        if (r["token_ids"], r["text"]) != (o["token_ids"], o["text"])
    ]
    return not differ, differ


def lossless_meaning(base_args) -> str:
    """What `identical_fraction` can prove on this server: bit-identical greedy outputs are
    expected on one device; across tensor-parallel ranks vLLM's reductions and batching are
    not bit-reproducible, so there a fraction below 1 can come from the engine itself."""
    args = list(base_args)
    tp = int(args[args.index("--tensor-parallel-size") + 1]) if ("--tensor-parallel-size" in args[:-1]) else 1
    if tp == 1:
        return (
            "greedy outputs of each method compared token for token with no speculation; "
            "on one device any difference is a speculation bug"
        )
    return (
        f"greedy outputs compared token for token with no speculation at tensor parallel "
        f"{tp}: vLLM is not bit-reproducible across ranks and batch shapes, so a few "
        "differing prompts can come from the engine; a speculation bug shows as many"
    )


def make_untrained_draft(trained_dir, out_dir, seed: int = 0) -> Path:
    """The floor: the trained checkpoint's config, vocabulary mapping and (frozen, target-owned)
    embeddings with fresh trainable weights."""
    import shutil

    # torch here only: the workflow imports this module for METHODS when it plans, and torch
    # would add a second to every Snakemake call.
    import torch
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


def plot_per_position(results: dict, out_png, title: str = "Per-position acceptance") -> None:
    """Grouped bars: for each draft position 1..k, each entry of `results` (a method, or a
    sweep's variant) with a per_position_acceptance list."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from eaglenest.io import atomic_path

    methods = [m for m in results if results[m].get("per_position_acceptance")]
    fig, ax = plt.subplots(figsize=(7, 4))
    # One group of bars per draft position 1..k, the methods side by side within it.
    width = 0.8 / max(len(methods), 1)
    positions = max((len(results[m]["per_position_acceptance"]) for m in methods), default=0)
    for j, m in enumerate(methods):
        acc = results[m]["per_position_acceptance"]
        offset = (j - (len(methods) - 1) / 2) * width
        bars = ax.bar([k + 1 + offset for k in range(len(acc))], acc, width, label=m)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.set_xticks(range(1, positions + 1))
    ax.set(
        xlabel="draft position (k-th proposed token)",
        ylabel="acceptance rate",
        ylim=(0, 1.3),  # room above the bars for the legend
        title=title,
    )
    ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    if methods:
        ax.legend(loc="upper center", ncol=min(3, len(methods)), fontsize="small")
    fig.tight_layout()
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)


def write_table(results: dict, out_csv) -> None:
    import pandas as pd

    from eaglenest.io import atomic_path

    cols = [
        "mean_acceptance_length",
        "acceptance_rate",
        "output_tokens_per_s",
        "lossless",
        "identical_fraction",
    ]
    df = pd.DataFrame([{"method": m, **{c: r.get(c) for c in cols}} for m, r in results.items()])
    with atomic_path(out_csv) as tmp:
        df.to_csv(tmp, index=False)


def evaluate_stage(
    *,
    run_dir,
    target,
    draft_dir,
    prompts_path,
    metadata_path,
    server_cfg: dict,
    k: int,
    max_tokens: int,
    concurrency: int,
    ngram: dict,
    out_json,
    out_csv,
    out_png,
    out_outputs,
    methods=METHODS,
    reference_outputs=None,
) -> dict:
    """The `evaluate_acceptance` rule: each of `methods`, one server each, same prompts; every
    greedy output goes to `out_outputs` (JSONL: method, id, token_ids, text). Without no_spec
    among `methods` (a sweep's variant), losslessness is judged against the no_spec outputs in
    `reference_outputs`, an earlier evaluation's `out_outputs`. `target` is the resolved target
    (eaglenest.target.Target)."""
    from eaglenest.errors import EaglenestError
    from eaglenest.io import read_json, write_json, write_jsonl

    meta = read_json(metadata_path)
    check_template(target, meta.get("chat_template_hash"), metadata_path)
    prompts = load_eval_prompts(prompts_path)
    if not prompts:
        raise EaglenestError("no held-out prompts to evaluate on", prompts_path)
    reference = [] if "no_spec" in methods else reference_rows(reference_outputs, prompts)
    drafts = {"draft": draft_dir}
    if "untrained_draft" in methods:
        drafts["untrained_draft"] = make_untrained_draft(
            draft_dir, Path(run_dir) / ".eaglenest" / "eval" / "untrained_draft"
        )
    results: dict = {}
    stored: list[dict] = []
    for method in methods:
        result, outs = serve_and_generate(
            method, target, server_cfg, run_dir, prompts,
            k=k, max_tokens=max_tokens, concurrency=concurrency, ngram=ngram, draft_dir=drafts.get(method),
        )  # fmt: skip
        if method == "no_spec":
            reference = outs
        stored += [{"method": method, **{f: o[f] for f in ("id", "token_ids", "text")}} for o in outs]
        same, differ = lossless(reference, outs)
        result.update(
            {
                "lossless": same,
                "identical_fraction": 1 - len(differ) / len(prompts),
                "prompts_differing": differ,
            }
        )
        log.info(
            "%s: mean acceptance length %.3f, rate %s, %.1f tok/s, lossless %s",
            method,
            result["mean_acceptance_length"],
            result["acceptance_rate"],
            result["output_tokens_per_s"] or 0,
            same,
        )
        results[method] = result
    summary = {
        "num_speculative_tokens": k,
        "prompts": len(prompts),
        "max_tokens": max_tokens,
        "lossless_means": lossless_meaning(server_cfg["base_args"]),
        **results,
    }
    write_jsonl(out_outputs, stored)
    write_table(results, out_csv)
    plot_per_position(results, out_png)
    write_json(out_json, summary)
    return summary


def serve_and_generate(
    method, target, server_cfg, run_dir, prompts, *, k, max_tokens, concurrency, ngram, draft_dir
) -> tuple[dict, list[dict]]:
    """One method on its own server (reused while its flags match): its acceptance and outputs."""
    from eaglenest.server import serving

    base, env = tuple(server_cfg["base_args"]), tuple(sorted(server_cfg["env"].items()))
    spec = method_spec(method, target.path, base, env, k=k, draft_dir=draft_dir, ngram=ngram)
    with serving(
        spec, run_dir, reuse=server_cfg["reuse"], timeout_s=server_cfg["startup_timeout_s"]
    ) as server:
        return evaluate_method(
            server,
            prompts,
            k=k,
            max_tokens=max_tokens,
            concurrency=concurrency,
            spec_decoding=method != "no_spec",
            stall_timeout_s=server_cfg["stall_timeout_s"],
        )


def reference_rows(path, prompts: list[dict]) -> list[dict]:
    """The no_spec outputs an earlier evaluation stored, in the order of `prompts`: they must be
    for these very prompts, or losslessness would compare different questions."""
    from eaglenest.errors import EaglenestError

    if path is None:
        raise EaglenestError("an evaluation without no_spec needs the reference outputs of one with it")
    by_id = {r["id"]: r for r in iter_jsonl(path) if r.get("method") == "no_spec"}
    missing = [p["id"] for p in prompts if p["id"] not in by_id]
    if missing:
        raise EaglenestError(
            f"holds no no_spec output for {len(missing)} of the {len(prompts)} held-out prompts "
            f"(first: {missing[0]}): it was made for other prompts",
            path,
        )
    return [by_id[p["id"]] for p in prompts]


def check_template(target, expected_hash: str | None, metadata_path) -> None:
    """Evaluation must render prompts with the template the training data was made with."""
    from eaglenest.errors import EaglenestError
    from eaglenest.target import load_tokenizer
    from eaglenest.tokenize import chat_template_hash

    if not expected_hash:
        return
    actual = chat_template_hash(load_tokenizer(target.path, target.trust_remote_code))
    if actual != expected_hash:
        raise EaglenestError(
            f"the target's chat template (hash {actual}) differs from the one "
            f"the training data was tokenized with ({expected_hash})",
            metadata_path,
        )
