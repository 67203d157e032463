"""Measure acceptance in vLLM: the number a user cares about.

On the held-out prompts, greedy, vLLM serves the target four ways: no speculation, n-gram
speculation, an untrained draft (the floor) and the trained draft, each with the same
`num_speculative_tokens`. Acceptance comes from each response's own spec-decode metrics
(`--per-request-spec-decode-metrics`), so it breaks down by benchmark, category, turn and
request, in both definitions users compare (eaglenest.data.benchmarks.request_acceptance).
Speculation must be lossless: each method's greedy outputs are compared with those of no
speculation. A sweep's variant serves its trained draft alone and is compared with the run's
own no-speculation outputs.

Each method also answers the configured benchmarks (eaglenest.data.benchmarks: MT-Bench and local
sets), turn by turn, on the same server.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from eaglenest.core.errors import EaglenestError
from eaglenest.core.io import atomic_path, iter_jsonl, read_json, read_jsonl, write_json, write_jsonl
from eaglenest.data.benchmarks import (
    ACCEPTANCE_DEFINITIONS,
    HELD_OUT,
    request_acceptance,
    target_steps,
    turn_messages,
)
from eaglenest.data.modes import DEFAULT_MODE, checked_modes
from eaglenest.draft.algorithms import folder_algorithm, trains_embeddings, vllm_speculative_config
from eaglenest.engine.server import SERVED_NAME, Server, ServerError, ServerSpec, StallWatch, serving
from eaglenest.target.resolve import load_tokenizer

log = logging.getLogger(__name__)

METHODS = ("no_spec", "ngram", "untrained_draft", "draft")


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
        # The served folder's own type decides how vLLM drafts with it (P-EAGLE: in parallel).
        spec = vllm_speculative_config(folder_algorithm(draft_dir), str(Path(draft_dir).resolve()), k)
        args += ["--speculative-config", json.dumps(spec)]
    elif method != "no_spec":
        raise ValueError(f"unknown method {method}")
    if method != "no_spec":  # vLLM refuses the flag without speculation
        args += ["--per-request-spec-decode-metrics", "summary"]  # each response's own acceptance
    return ServerSpec(model=target, args=tuple(args), env=env)


def generate(server: Server, prompts: list[dict], max_tokens: int, concurrency: int, stall_timeout_s: float):
    """Greedy completions (token ids and text) for every prompt; returns (outputs, seconds).
    Every prompt must be answered (the methods are compared prompt by prompt): a request that
    fails twice, or a server silent for `stall_timeout_s`, fails the stage."""

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
                # The client sends extra_body's keys at the top level of the request, where vLLM
                # reads chat_template_kwargs (the prompt's mode).
                extra_body={"return_token_ids": True, "ignore_eos": False, **_mode_fields(p)},
            )
        except openai.APIError as e:
            watch.check(e)
            raise ServerError(f"prompt {p['id']}: the server failed it twice: {e}", server.log_path) from e
        watch.answered()
        return response_row(p["id"], r.model_dump())

    t0 = time.monotonic()
    pool = ThreadPoolExecutor(concurrency)
    try:
        outs = list(pool.map(one, prompts))
    finally:  # on a failure, fail now: queued prompts are dropped, not sent to a hung server
        pool.shutdown(wait=False, cancel_futures=True)
    return outs, time.monotonic() - t0


def response_row(prompt_id: str, response: dict) -> dict:
    """What evaluation keeps of one chat-completion response (its JSON body): the greedy text
    and token ids, the token counts, and vLLM's per-request spec-decode metrics (None without
    speculation)."""
    choice = response["choices"][0]
    return {
        "id": prompt_id,
        "text": choice["message"].get("content") or "",
        "token_ids": choice.get("token_ids"),
        "prompt_tokens": response["usage"]["prompt_tokens"],
        "completion_tokens": response["usage"]["completion_tokens"],
        "spec": (response.get("metrics") or {}).get("speculative_decoding"),
    }


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
    """Every prompt answered greedily; acceptance from each response's own spec-decode metrics
    (`request_acceptance`: tokens per target step, vLLM's per-draft figure, per position)."""
    outs, seconds = generate(server, prompts, max_tokens, concurrency, stall_timeout_s)
    if spec_decoding and (missing := [o["id"] for o in outs if not o["spec"]]):
        # Counted as steps of one token each, they would pull the figure down unseen.
        raise ServerError(
            f"{len(missing)} responses carry no per-request spec-decode metrics (e.g. prompt "
            f"{missing[0]}): the server needs --per-request-spec-decode-metrics",
            server.log_path,
        )
    result = request_acceptance(outs, k)
    tokens = result["output_tokens"]
    result.update(
        seconds=round(seconds, 3), output_tokens_per_s=round(tokens / seconds, 2) if seconds else None
    )
    return result, outs


def lossless(reference: list[dict], outs: list[dict]) -> tuple[bool, list[str]]:
    """Greedy speculation must reproduce the outputs without it, token for token."""
    differ = [
        o["id"]
        for r, o in zip(reference, outs, strict=True)
        if (r["token_ids"], r["text"]) != (o["token_ids"], o["text"])
    ]
    return not differ, differ


def tensor_parallel_size(base_args) -> int:
    args = list(base_args)
    return int(args[args.index("--tensor-parallel-size") + 1]) if "--tensor-parallel-size" in args[:-1] else 1


def noise_floor_margin(floor: float, prompts: int) -> float:
    """How far under n-gram's identical fraction a lossless draft may land by chance: two
    binomial standard errors and one prompt."""
    return 2 * (floor * (1 - floor) / prompts) ** 0.5 + 1 / prompts


def judge_against_noise_floor(results: dict, floor: float, prompts: int) -> None:
    """Across tensor-parallel ranks a correct draft's greedy outputs can differ from no
    speculation's: verification runs other batch shapes, and vLLM's reductions are not
    bit-reproducible. n-gram drafting is always right or wrong by table lookup, so what
    differs under it is the engine's own noise: its identical fraction is the floor. A draft
    is lossless when its identical fraction is within two binomial standard errors (and one
    prompt) of that floor; far below it is a speculation bug. The strict figure is kept."""
    margin = noise_floor_margin(floor, prompts)
    for method, r in results.items():
        if method in ("no_spec", "ngram"):
            continue
        r["lossless_bit_exact"] = r["lossless"]
        r["lossless"] = r["identical_fraction"] >= floor - margin
        r["noise_floor"] = {"ngram_identical_fraction": floor, "margin": round(margin, 4)}


def ngram_identical_fraction(rows: list[dict], answers: dict, set_name: str = HELD_OUT) -> float | None:
    """n-gram's share of a set's outputs equal to no speculation's (the noise floor)."""
    ngram = [r for r in rows if r["method"] == "ngram" and r.get("set", HELD_OUT) == set_name]
    if not ngram:
        return None
    _, differ = lossless([answers[(set_name, r["id"], r.get("turn", 0))] for r in ngram], ngram)
    return 1 - len(differ) / len(ngram)


def lossless_meaning(tp: int, noise_floor: float | None) -> str:
    """What `lossless` proves on this server: bit-identical greedy outputs where the engine is
    reproducible; against n-gram's identical fraction (`noise_floor`) where it is not."""
    if noise_floor is None:
        return (
            "greedy outputs of each method compared token for token with no speculation; "
            "n-gram's were identical, so any difference is a speculation bug"
        )
    return (
        f"greedy outputs compared token for token with no speculation: even n-gram's differ on "
        f"{1 - noise_floor:.0%} of the held-out prompts (tensor parallel {tp}; 16-bit kernels "
        "verify in other batch shapes than they decode), so a draft is judged against that "
        "noise floor (`noise_floor`; the strict comparison is `lossless_bit_exact`)"
    )


def make_untrained_draft(trained_dir, out_dir, target_dir, seed: int = 0) -> Path:
    """The floor: the trained checkpoint's config, vocabulary mapping and the target's own
    embeddings with fresh trainable weights. EAGLE-3 keeps the target's embeddings frozen, so
    the checkpoint's are the target's; P-EAGLE trains them, so they are read back from the
    target (`target_dir`) with speculators' own loader, the one its training starts from. DFlash
    saves no embedding, and its head is the target's own rows, frozen, so that is kept too."""

    # torch here only: the workflow imports this module for METHODS when it plans, and torch
    # would add a second to every Snakemake call.
    import torch
    from safetensors.torch import load_file, save_file

    with atomic_path(out_dir, is_dir=True) as tmp:
        for f in Path(trained_dir).iterdir():
            if f.suffix == ".json" and f.name == "config.json":
                shutil.copy(f, tmp / f.name)
        gen = torch.Generator().manual_seed(seed)
        weights = load_file(str(Path(trained_dir) / "model.safetensors"))
        fresh = {}
        algorithm = folder_algorithm(trained_dir)
        frozen = ("d2t", "t2d", "lm_head.weight") if algorithm == "dflash" else ("d2t", "t2d")
        for name, w in weights.items():
            if name in frozen or "embed_tokens" in name or not w.is_floating_point():
                fresh[name] = w
            elif "norm" in name:
                fresh[name] = torch.ones_like(w)
            else:
                fresh[name] = (torch.randn(w.shape, generator=gen) * 0.02).to(w.dtype)
        if trains_embeddings(algorithm):
            from speculators.utils.loading import load_model_layers

            embed = load_model_layers(["embed_tokens.weight"], str(target_dir))["embed_tokens.weight"]
            fresh["embed_tokens.weight"] = embed.to(weights["embed_tokens.weight"].dtype)
        save_file(fresh, str(tmp / "model.safetensors"))
    return Path(out_dir)


def load_eval_prompts(path, modes=None) -> list[dict]:
    """The held-out prompts, each with its tools and its mode's template switches."""
    by_name = {m["name"]: m for m in checked_modes(modes)}
    prompts = []
    for r in iter_jsonl(path):
        mode = r.get("mode") or DEFAULT_MODE
        if mode not in by_name:
            raise EaglenestError(f"prompt {r['id']}: mode {mode!r} is not configured", path)
        prompt = {"id": r["id"], "messages": r["messages"], "mode": mode}
        if by_name[mode]["chat_template_kwargs"]:
            prompt["chat_template_kwargs"] = by_name[mode]["chat_template_kwargs"]
        if r.get("tools"):
            prompt["tools"] = r["tools"]
        prompts.append(prompt)
    return prompts


def _mode_fields(prompt: dict) -> dict:
    """A prompt's request fields besides its messages: its mode's switches, and its tools (with
    tool_choice none: evaluation measures the answer, it runs no tool loop)."""
    fields = {}
    if prompt.get("chat_template_kwargs"):
        fields["chat_template_kwargs"] = prompt["chat_template_kwargs"]
    if prompt.get("tools"):
        fields.update(tools=prompt["tools"], tool_choice="none")
    return fields


def plot_per_position(results: dict, out_png, title: str = "Per-position acceptance") -> None:
    """Grouped bars: for each draft position 1..k, each entry of `results` (a method, or a
    sweep's variant) with a per_position_acceptance list."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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

    cols = [
        "mean_acceptance_length",
        "mean_acceptance_length_per_draft",
        "acceptance_rate",
        "output_tokens_per_s",
        "lossless",
        "identical_fraction",
    ]
    df = pd.DataFrame([{"method": m, **{c: r.get(c) for c in cols}} for m, r in results.items()])
    with atomic_path(out_csv) as tmp:
        df.to_csv(tmp, index=False)


def _evaluation_inputs(
    target, metadata_path, prompts_path, benchmarks_path, modes=None
) -> tuple[list[dict], list[dict]]:
    """The held-out prompts and the benchmark conversations, once the chat template is checked."""
    meta = read_json(metadata_path)
    check_template(target, meta.get("chat_template_hash"), metadata_path)
    prompts = load_eval_prompts(prompts_path, modes)
    if not prompts:
        raise EaglenestError("no held-out prompts to evaluate on", prompts_path)
    conversations = read_jsonl(benchmarks_path) if benchmarks_path else []
    return prompts, conversations


def _drafts(methods, draft_dir, run_dir, target) -> dict:
    """The draft folder each draft method serves: the trained draft, and an untrained one if asked."""
    drafts = {"draft": draft_dir}
    if "untrained_draft" in methods:
        drafts["untrained_draft"] = make_untrained_draft(
            draft_dir, Path(run_dir) / ".eaglenest" / "eval" / "untrained_draft", target.path
        )
    return drafts


def _ask_method(
    server: Server, method: str, prompts, conversations, answers: dict, k: int, gen: dict
) -> tuple[dict, dict]:
    """One method's result and its sets' outputs: the held-out prompts, then each benchmark's conversations."""
    result, outs = evaluate_method(server, prompts, k=k, spec_decoding=method != "no_spec", **gen)
    asked = {p["id"]: p for p in prompts}
    outs = [
        {
            **o,
            "set": HELD_OUT,
            "turn": 0,
            "category": "all",
            **traffic_of(asked[o["id"]], asked[o["id"]]["mode"]),
        }
        for o in outs
    ]
    if method == "no_spec":
        answers.update({(o["set"], o["id"], 0): o for o in outs})
    sets = {HELD_OUT: (outs, result["seconds"], [])}
    for name in dict.fromkeys(c["benchmark"] for c in conversations):
        convs = [c for c in conversations if c["benchmark"] == name]
        sets[name] = ask_conversations(server, convs, answers, is_reference=method == "no_spec", **gen)
    return result, sets


def _evaluate_methods(
    methods, target, server_cfg, run_dir, k, ngram, drafts, prompts, conversations, answers, gen
) -> tuple[dict, dict, list[dict]]:
    """Each method on its own server: the results, the per-set figures and every stored output."""
    results: dict = {}
    per_set: dict = {}
    stored: list[dict] = []
    for method in methods:
        with method_server(
            method, target, server_cfg, run_dir, k=k, ngram=ngram, draft_dir=drafts.get(method)
        ) as server:
            result, sets = _ask_method(server, method, prompts, conversations, answers, k, gen)
        stored += outs_of(method, sets)
        held_out, _, _ = sets[HELD_OUT]
        result.update(lossless_fields(held_out, answers))
        log.info(
            "%s: mean acceptance length %.3f, rate %s, %.1f tok/s, lossless %s",
            method,
            result["mean_acceptance_length"],
            result["acceptance_rate"],
            result["output_tokens_per_s"] or 0,
            result["lossless"],
        )
        results[method] = result
        per_set[method] = {name: set_figures(*asked, answers, k) for name, asked in sets.items()}
    return results, per_set, stored


def _judge_lossless(
    results, per_set, stored, answers, prompts, conversations, methods, server_cfg, reference_outputs
) -> str:
    """Judge the drafts against n-gram's noise floor where there is one; what `lossless` means here."""
    # Where the engine is not bit-reproducible (tensor parallel ranks; 16-bit kernels whose
    # verification batches differ from decoding), n-gram's outputs already differ: then a
    # draft is judged against that floor. Where n-gram is exact, any difference is a bug.
    tp = tensor_parallel_size(server_cfg["base_args"])
    rows = stored if "ngram" in methods else list(iter_jsonl(reference_outputs))
    floor = ngram_identical_fraction(rows, answers)
    noisy = floor is not None and (tp > 1 or floor < 1)
    if noisy:
        judge_against_noise_floor(results, floor, len(prompts))
        for name in dict.fromkeys(c["benchmark"] for c in conversations):
            set_floor = ngram_identical_fraction(rows, answers, name)
            if set_floor is not None:
                figures = {m: per_set[m][name] for m in methods}
                judge_against_noise_floor(figures, set_floor, per_set[methods[-1]][name]["requests"])
    return lossless_meaning(tp, floor if noisy else None)


def _benchmark_figures(per_set: dict, conversations: list[dict], methods) -> dict:
    """Each benchmark's conversation count and every method's figures on it."""
    return {
        name: {
            "conversations": sum(c["benchmark"] == name for c in conversations),
            **{m: per_set[m][name] for m in methods},
        }
        for name in dict.fromkeys(c["benchmark"] for c in conversations)
    }


def _write_outputs(
    stored, results, per_set, summary, out_outputs, out_csv, out_png, out_sets, out_requests,
    out_request_png, out_json,
) -> None:  # fmt: skip
    """Write the stage's files: outputs, tables, plots, and last the summary."""
    write_jsonl(out_outputs, [{f: o[f] for f in STORED_FIELDS} for o in stored])
    write_table(results, out_csv)
    plot_per_position(results, out_png)
    if out_sets:
        write_set_table(per_set, out_sets)
    requests = request_rows(stored)
    if out_requests:
        write_requests(requests, out_requests)
    if out_request_png:
        plot_requests(requests, out_request_png, summary["num_speculative_tokens"])
    write_json(out_json, summary)


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
    benchmarks_path=None,
    out_sets=None,
    out_requests=None,
    out_request_png=None,
    methods=METHODS,
    reference_outputs=None,
    modes=None,
) -> dict:
    """The `evaluate_acceptance` rule: each of `methods` on one server each, the held-out
    prompts then every benchmark conversation of `benchmarks_path` (eaglenest.data.benchmarks),
    turn by turn. Every greedy output goes to `out_outputs` (JSONL: method, set, id, turn,
    token_ids, text). Without no_spec among `methods` (a sweep's variant), losslessness and the
    earlier turns' answers come from the no_spec outputs in `reference_outputs`, an earlier
    evaluation's `out_outputs`. `target` is the resolved target (eaglenest.target.resolve.Target)."""

    prompts, conversations = _evaluation_inputs(target, metadata_path, prompts_path, benchmarks_path, modes)
    # no_spec's outputs by (set, id, turn): the reference every method must equal, and the
    # answers a conversation's later turns are asked after.
    answers = {} if "no_spec" in methods else reference_answers(reference_outputs, prompts, conversations)
    drafts = _drafts(methods, draft_dir, run_dir, target)
    gen = dict(max_tokens=max_tokens, concurrency=concurrency, stall_timeout_s=server_cfg["stall_timeout_s"])
    results, per_set, stored = _evaluate_methods(
        methods, target, server_cfg, run_dir, k, ngram, drafts, prompts, conversations, answers, gen
    )
    lossless_means = _judge_lossless(
        results, per_set, stored, answers, prompts, conversations, methods, server_cfg, reference_outputs
    )
    summary = {
        "num_speculative_tokens": k,
        "prompts": len(prompts),
        "max_tokens": max_tokens,
        "lossless_means": lossless_means,
        "definitions": ACCEPTANCE_DEFINITIONS,
        **results,
        "benchmarks": _benchmark_figures(per_set, conversations, methods),
    }
    _write_outputs(
        stored, results, per_set, summary, out_outputs, out_csv, out_png, out_sets, out_requests,
        out_request_png, out_json,
    )  # fmt: skip
    return summary


STORED_FIELDS = ("method", "set", "id", "turn", "token_ids", "text")


def outs_of(method: str, sets: dict) -> list[dict]:
    return [{"method": method, **o} for outs, _, _ in sets.values() for o in outs]


def ask_conversations(
    server,
    conversations: list[dict],
    answers: dict,
    *,
    is_reference: bool,
    max_tokens,
    concurrency,
    stall_timeout_s,
) -> tuple[list[dict], float]:
    """Every turn of a benchmark's conversations, a turn of all of them at a time; turn t is
    asked after the reference's answers to the turns before it (no_spec's, which `is_reference`
    records as it goes). Returns the outputs and the seconds spent generating."""
    outs_all, seconds, too_long = [], 0.0, []
    for turn in range(max(len(c["turns"]) for c in conversations)):
        asked = [c for c in conversations if len(c["turns"]) > turn and c["id"] not in too_long]
        prompts = [
            {
                "id": c["id"],
                "messages": turn_messages(
                    c, turn, [answers[(c["benchmark"], c["id"], t)]["text"] for t in range(turn)]
                ),
                **({"tools": c["tools"]} if c.get("tools") else {}),
            }
            for c in asked
        ]
        # A turn whose prompt leaves no room for its answer would fail at the server: it and
        # the conversation's later turns are left out, the same for every method.
        fit = room_for_answer(server, prompts, max_tokens)
        too_long += [c["id"] for c, ok in zip(asked, fit, strict=True) if not ok]
        asked = [c for c, ok in zip(asked, fit, strict=True) if ok]
        prompts = [p for p, ok in zip(prompts, fit, strict=True) if ok]
        if not prompts:
            break
        outs, s = generate(server, prompts, max_tokens, concurrency, stall_timeout_s)
        seconds += s
        outs = [
            {
                **o,
                "set": c["benchmark"],
                "turn": turn,
                "category": c["category"],
                **traffic_of(c, DEFAULT_MODE),
            }
            for c, o in zip(asked, outs, strict=True)
        ]
        if is_reference:
            answers.update({(o["set"], o["id"], turn): o for o in outs})
        outs_all += outs
    return outs_all, seconds, too_long


def room_for_answer(server: Server, prompts: list[dict], max_tokens: int) -> list[bool]:
    """Whether each prompt, rendered by the server itself (its /tokenize endpoint, with the
    template it serves), leaves `max_tokens` within its max_model_len."""
    fits = []
    for p in prompts:
        body = json.dumps(
            {
                "model": SERVED_NAME,
                "messages": p["messages"],
                "add_generation_prompt": True,
                **_mode_fields(p),
            }
        )
        request = urllib.request.Request(
            f"{server.base_url}/tokenize",
            data=body.encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {server.client_key}"},
        )
        with urllib.request.urlopen(request, timeout=60) as r:
            answer = json.loads(r.read())
        fits.append(answer["count"] + max_tokens <= answer["max_model_len"])
    return fits


def lossless_fields(outs: list[dict], answers: dict) -> dict:
    """Greedy speculation must reproduce the outputs without it, token for token."""
    reference = [answers[(o["set"], o["id"], o["turn"])] for o in outs]
    same, differ = lossless(reference, outs)
    return {
        "lossless": same,
        "identical_fraction": 1 - len(differ) / len(outs),
        "prompts_differing": differ,
    }


def traffic_of(asked: dict, mode: str) -> dict:
    """What a request was, for the figures per mode and traffic class: the mode its switches came
    from (benchmarks: the template's default) and whether it came with tools."""
    return {"mode": mode, "traffic": "tool" if asked.get("tools") else "chat"}


# The groups a set's figures are also given per, where a set has more than one of them.
GROUPS = ("category", "turn", "mode", "traffic")


def set_figures(outs: list[dict], seconds: float, too_long: list[str], answers: dict, k: int) -> dict:
    """One method on one evaluated set: acceptance from the per-request metrics, overall, per
    category, turn, mode and traffic class, its output tokens/s, and losslessness."""
    figures = request_acceptance(outs, k)
    figures["conversations_cut_too_long"] = too_long
    figures["output_tokens_per_s"] = round(figures["output_tokens"] / seconds, 2) if seconds else None
    figures.update(lossless_fields(outs, answers))
    for key in GROUPS:
        groups = dict.fromkeys(o[key] for o in outs)
        if len(groups) > 1:
            figures[f"per_{key}"] = {
                str(g): request_acceptance([o for o in outs if o[key] == g], k) for g in groups
            }
    return figures


def write_set_table(per_set: dict, out_csv) -> None:
    """One row per method, set and category ("all" for the whole set), and per mode and traffic
    class where a set has several (their other columns "all")."""
    import pandas as pd

    rows = []
    for method, sets in per_set.items():
        for name, fig in sets.items():
            groups = [("category", "all", fig)]
            groups += [
                (key, g, figures)
                for key in ("category", "mode", "traffic")
                for g, figures in fig.get(f"per_{key}", {}).items()
            ]
            for key, value, g in groups:
                row = {
                    "set": name,
                    "category": "all",
                    "mode": "all",
                    "traffic": "all",
                    key: value,
                    "method": method,
                    "requests": g["requests"],
                    "mean_acceptance_length": g["mean_acceptance_length"],
                    "mean_acceptance_length_per_draft": g["mean_acceptance_length_per_draft"],
                    "acceptance_rate": g["acceptance_rate"],
                }
                for i, a in enumerate(g["per_position_acceptance"] or []):
                    row[f"acceptance_pos_{i + 1}"] = a
                if g is fig:
                    row.update(output_tokens_per_s=fig["output_tokens_per_s"], lossless=fig["lossless"])
                rows.append(row)
    with atomic_path(out_csv) as tmp:
        pd.DataFrame(rows).to_csv(tmp, index=False)


def request_rows(stored: list[dict]) -> list[dict]:
    """Each request's own figures (one turn of one prompt of one method)."""
    rows = []
    for o in stored:
        spec = o.get("spec") or {}
        tokens = o["completion_tokens"]
        steps = target_steps(tokens, o.get("spec"))
        rows.append(
            {
                "method": o["method"],
                "set": o["set"],
                "category": o["category"],
                "mode": o.get("mode", DEFAULT_MODE),
                "traffic": o.get("traffic", "chat"),
                "id": o["id"],
                "turn": o["turn"] + 1,
                "prompt_tokens": o["prompt_tokens"],
                "output_tokens": tokens,
                "accepted_tokens": spec.get("num_accepted_draft_tokens", 0),
                "draft_tokens": spec.get("num_draft_tokens", 0),
                "drafting_steps": spec.get("num_spec_steps", 0),
                "target_steps": steps,
                "tokens_per_step": tokens / steps,
            }
        )
    return rows


def write_requests(requests: list[dict], out_csv) -> None:
    import pandas as pd

    with atomic_path(out_csv) as tmp:
        pd.DataFrame(requests).to_csv(tmp, index=False)


def plot_requests(requests: list[dict], out_png, k: int) -> None:
    """The spread of tokens per target step across requests, per set and speculating method,
    and each request's against its prompt length, under the ceiling k + 1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    df = pd.DataFrame(requests)
    df = df[df["method"].isin([m for m in ("ngram", "draft") if m in set(df["method"])])]
    fig, (ax_box, ax_len) = plt.subplots(1, 2, figsize=(11, 4))
    groups = [(s, m) for s in dict.fromkeys(df["set"]) for m in dict.fromkeys(df["method"])]
    data = [df[(df["set"] == s) & (df["method"] == m)]["tokens_per_step"] for s, m in groups]
    if groups:
        ax_box.boxplot(data, showmeans=True)
        ax_box.set_xticks(range(1, len(groups) + 1), [f"{s}\n{m}" for s, m in groups], fontsize=8)
    ax_box.set(
        ylabel="tokens per target step (per request)", title="Across requests (line: median, triangle: mean)"
    )
    for m, marker in (("ngram", "x"), ("draft", "o")):
        sub = df[df["method"] == m]
        if len(sub):
            ax_len.scatter(
                sub["prompt_tokens"], sub["tokens_per_step"], s=12, marker=marker, alpha=0.6, label=m
            )
    ax_len.set(xlabel="prompt tokens (context the turn was asked with)", ylabel="tokens per target step",
               title="Against context length")  # fmt: skip
    for ax in (ax_box, ax_len):
        ax.axhline(k + 1, color="grey", linestyle="--", linewidth=1, label=f"ceiling k + 1 = {k + 1}")
        ax.set_ylim(0.9, k + 1.3)
    if len(df):
        ax_len.legend(fontsize="small")
    fig.tight_layout()
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)


@contextlib.contextmanager
def method_server(method, target, server_cfg, run_dir, *, k, ngram, draft_dir):
    """One method's server (reused while its flags match)."""

    base, env = tuple(server_cfg["base_args"]), tuple(sorted(server_cfg["env"].items()))
    spec = method_spec(method, target.path, base, env, k=k, draft_dir=draft_dir, ngram=ngram)
    with serving(
        spec, run_dir, reuse=server_cfg["reuse"], timeout_s=server_cfg["startup_timeout_s"]
    ) as server:
        yield server


def reference_answers(path, prompts: list[dict], conversations: list[dict]) -> dict:
    """The no_spec outputs an earlier evaluation stored, by (set, id, turn): they must cover
    these very prompts and conversations, or losslessness would compare different questions."""

    if path is None:
        raise EaglenestError("an evaluation without no_spec needs the reference outputs of one with it")
    found = {
        (r.get("set", HELD_OUT), r["id"], r.get("turn", 0)): r
        for r in iter_jsonl(path)
        if r.get("method") == "no_spec"
    }
    needed = [(HELD_OUT, p["id"], 0) for p in prompts]
    needed += [(c["benchmark"], c["id"], t) for c in conversations for t in range(len(c["turns"]))]
    missing = [key for key in needed if key not in found]
    if missing:
        where, pid, turn = missing[0]
        raise EaglenestError(
            f"holds no no_spec output for {len(missing)} of the {len(needed)} prompts evaluated "
            f"(first: {pid}, turn {turn + 1} of {where}): it was made for other prompts",
            path,
        )
    return found


def check_template(target, expected_hash: str | None, metadata_path) -> None:
    """Evaluation must render prompts with the template the training data was made with."""
    # Lazy: tokenize brings numpy, and the Snakefile imports this module (METHODS) on every plan.
    from eaglenest.data.tokenize import chat_template_hash

    if not expected_hash:
        return
    actual = chat_template_hash(load_tokenizer(target.path, target.trust_remote_code))
    if actual != expected_hash:
        raise EaglenestError(
            f"the target's chat template (hash {actual}) differs from the one "
            f"the training data was tokenized with ({expected_hash})",
            metadata_path,
        )
