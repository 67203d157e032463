"""eaglenest against speculators' own recipe: same target, same prompts, evaluated the same way.

Three arms, each evaluated on the run's held-out prompts and its benchmarks (MT-Bench where the
config names it):
- (a) `speculators`: speculators' documented offline recipe, data and training (below).
- (b) `speculators_data`: (a)'s data (its regenerate-responses, prepare-data and
  generate-offline-data, and the vocabulary mapping its trainer builds from that data's token
  counts) trained with eaglenest's trainer settings (the run's `train` section and draft
  config) for exactly as many optimizer steps as (c) took. The difference between (b) and (c)
  is the data pipeline: served token ids, template-exact loss masks, earlier turns trained.
- (c) `eaglenest`: the finished run as it is.

Inputs: the working directory of a finished eaglenest run (`snakemake --cores all`), its target,
its training prompts (`prompts/prompts.jsonl`) and held-out prompts (`prompts/eval_prompts.jsonl`).

- eaglenest: the finished run as it is. Wall time to a draft: the sum of the Snakemake benchmark
  seconds (`stage_times.csv`) of the stages from prompts to the exported draft.
- speculators 0.9.0, its documented offline EAGLE-3 recipe, each step timed, in
  `<run_dir>/bench_vs_speculators/` (git-ignored, wiped first):
  1. `speculators regenerate-responses` on the training prompts against a vLLM server of the
     target (the run's vLLM flags), with the run's regenerate max_tokens and temperature;
  2. `speculators prepare-data` on its output (pre-tokenized rows: no render server needed),
     `--no-skip-token-freq` for the token_freq.pt that step 4 needs;
  3. `speculators generate-offline-data` against a vLLM server with the `extract_hidden_states`
     method and the hidden-states connector (eaglenest's CPU subclass on CPU);
  4. `speculators train`, its defaults, with the documented `--draft-vocab-size` (eaglenest's,
     so that the vocabulary size is not what differs) and `--on-missing raise`; it builds
     d2t/t2d itself from token_freq.pt. On CPU it runs as `python -m eaglenest.training.train` (the same
     trainer with eaglenest's CPU patches) with `--loss-implementation eager --draft-attn-impl
     sdpa`. Its last epoch's checkpoint is the draft: vLLM serves speculators' format directly.
- Evaluation: both drafts in this one process, back to back, with eaglenest's own evaluation
  (`eaglenest.evaluation.evaluate.evaluate_stage`, method "draft") on the held-out prompts.

Prints each arm's steps and wall seconds, training rows, epochs, tokens per target step,
per-position acceptance and output tokens/s, and writes them to
`<run_dir>/bench_vs_speculators/bench_vs_speculators.json`; with --record the run (its
figures and tables) is added to the record `vs_speculators` (benchmarks/records/, with date,
commit, machine, command, versions), which `make docs` renders. On a 2-core CPU machine its
trainer defaults (8,192 tokens a step, 12 loader workers) take about 4 minutes an epoch on the
default run's data, so its default 20 epochs take over an hour: `--spec-epochs 5` is the value
speculators' own offline example script passes (examples/train/eagle3_llama3_8b_sharegpt_offline_5k.sh,
which also lowers lr to 1e-4).

(b)'s step budget: eaglenest's per-epoch step counts (`train/train_metrics.json`) summed; its
epochs are the fewest whose steps reach the budget, counted with speculators' own packing sampler
over (a)'s training split (the packing differs per epoch), and `--max-steps` stops it there. Its
own step count is read back from its metrics and printed beside (c)'s.

Usage: python benchmarks/bench_vs_speculators.py --workdir WORKDIR_OF_A_FINISHED_RUN
         [--configfile CONFIG [OVERLAY ...]] [--arms speculators speculators_data eaglenest]
         [--spec-epochs N] [--spec-train-args "--num-workers 2"] [--record]
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from records import append_run, command_line, head_commit, repo_path

REPO = Path(__file__).resolve().parents[1]
# The stages of a finished run that turn the prompts into the exported draft.
EAGLENEST_STAGES = (
    "regenerate_responses", "tokenize", "build_vocab_mapping", "draft_config",
    "plan_hidden_states", "extract_hidden_states", "train_draft", "export_draft",
)  # fmt: skip
# (a) speculators' recipe, (b) its data with eaglenest's training, (c) eaglenest.
ARMS = ("speculators", "speculators_data", "eaglenest")
# speculators' trainer settings worth printing, with whether each is its default.
TRAIN_SETTINGS = (
    "epochs", "lr", "optimizer", "weight_decay", "scheduler_type", "ttt_steps", "loss_fn",
    "total_seq_len", "hidden_states_dtype", "num_workers", "train_data_ratio", "seed", "num_layers",
    "sliding_window", "draft_vocab_size", "target_layer_ids",
)  # fmt: skip
# Each arm's figures in the record, named as its earlier runs name them so that runs line up.
ARM_FIGURE = {
    "speculators": "speculators' recipe {}",
    "speculators_data": "speculators' data, eaglenest's training: {}",
    "eaglenest": "eaglenest: {}",
}
RECORDED_NAMES = {"eaglenest: wall to a draft (s)": "eaglenest wall to a draft (s)"}
BENCH_NAMES = {"mt_bench": "MT-Bench"}


@contextlib.contextmanager
def timed(steps: dict, name: str):
    t0 = time.perf_counter()
    yield
    steps[name] = round(time.perf_counter() - t0, 1)
    print(f"  {name}: {steps[name]:.1f} s", flush=True)


def run(cmd: list[str], cwd: Path, log: Path, env: dict | None = None) -> None:
    """One command of the recipe, its output to `log` (`env`: more variables for it); a failure
    stops the benchmark."""
    from eaglenest.engine.server import log_tail

    print("  $ " + shlex.join(cmd), flush=True)
    with open(log, "wb") as f:
        rc = subprocess.run(
            cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        ).returncode
    if rc:
        raise SystemExit(f"{shlex.join(cmd[:4])} failed (exit {rc}). Last lines of {log}:\n{log_tail(log)}")


def speculators_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "speculators", *args]


def regenerate_sampling_flags(rg: dict) -> list[str]:
    """regenerate-responses' flags for the run's `regenerate` settings; as in eaglenest, a
    setting the config leaves out is not sent (the server's default applies)."""
    flags = ["--max-tokens", str(rg["max_tokens"])] if "max_tokens" in rg else []
    if "temperature" in rg:
        # A temperature distribution (JSON), not a number: a plain 0 crashes it.
        flags += ["--temperature", json.dumps({str(float(rg["temperature"])): 1.0})]
    if "top_p" in rg:
        flags += ["--sampling-params", json.dumps({"top_p": rg["top_p"]})]
    return flags


def speculators_arm(
    cfg: dict, target, run_dir: Path, scratch: Path, epochs, extra_train_args, train: bool = True
) -> dict:
    """Arm (a): speculators' recipe, each step timed; without `train`, its data steps only
    (what arm (b) trains on)."""
    from datasets import load_from_disk
    from speculators.train.config import TrainConfig

    from eaglenest.draft.aux_layers import default_aux_layer_ids, resolve_aux_layer_ids
    from eaglenest.engine.server import SERVED_NAME, ServerSpec, serving
    from eaglenest.hidden_states.extract import vllm_extraction_spec
    from eaglenest.pipeline.workflow import resolve_device, vllm_base_args, vllm_env
    from eaglenest.training.checkpoints import epochs_done

    base, env = vllm_base_args(cfg["vllm"], cfg["target"]), vllm_env(cfg["vllm"])
    timeout = cfg["vllm"]["startup_timeout_s"]
    cpu = resolve_device(cfg["vllm"]["device"]) == "cpu"
    remote = ["--trust-remote-code"] if target.trust_remote_code else []
    regen, prep, ckpts = scratch / "regenerated.jsonl", scratch / "prepared", scratch / "checkpoints"
    logs = scratch / "logs"
    logs.mkdir(parents=True)
    steps: dict[str, float] = {}

    n = target.shape["num_layers"]
    aux = resolve_aux_layer_ids(cfg["hidden_states"]["aux_layer_ids"], n)
    # speculators' default (launch_vllm.py and train) is the same [2, n//2, n-3].
    default_aux = aux == default_aux_layer_ids(n)
    print(f"  aux layers {aux}: {'speculators default' if default_aux else 'the config (not the default)'}")
    train_args = [
        "--verifier-name-or-path", target.path, "--data-path", str(prep), "--save-path", str(ckpts),
        "--draft-vocab-size", str(cfg["vocab"]["draft_vocab_size"]), "--on-missing", "raise", *remote,
        *([] if default_aux else ["--target-layer-ids", *map(str, aux)]),
        *(["--epochs", str(epochs)] if epochs else []),
        *extra_train_args,
        # The fused loss is a Triton kernel and FlexAttention has no CPU backward.
        *(["--loss-implementation", "eager", "--draft-attn-impl", "sdpa"] if cpu else []),
    ]  # fmt: skip
    # Resolved now, so that its settings show (and a bad flag fails) before the long steps.
    resolved = TrainConfig.resolve(train_args)
    flat, origin = resolved.flatten(), resolved.provenance
    settings = {k: flat[k] for k in TRAIN_SETTINGS}
    print(
        "  train settings: "
        + ", ".join(f"{k} {v}{'' if origin.get(k) == 'default' else ' (set)'}" for k, v in settings.items())
    )

    # speculators' servers run without eaglenest's API key: its clients send none.
    no_key = dict(reuse=False, timeout_s=timeout, api_key=False)

    # regenerate-responses loads its tokenizer from --model and sends that same name as the
    # request's model: the server answers to the target's folder as well as to "target".
    rg = cfg["regenerate"]
    spec = ServerSpec(target.path, (*base, "--served-model-name", SERVED_NAME, target.path), env)
    with timed(steps, "regenerate-responses"), serving(spec, scratch, **no_key) as server:
        run(
            speculators_cmd(
                "regenerate-responses", "--endpoint", f"{server.api_url}/chat/completions",
                "--model", target.path, "--dataset", str(run_dir / "prompts" / "prompts.jsonl"),
                "--outfile", str(regen), *regenerate_sampling_flags(rg),
            ),
            scratch, logs / "regenerate-responses.log",
        )  # fmt: skip
    errors = regen.with_name("regenerated.errors.jsonl")
    failed = len(errors.read_text().splitlines()) if errors.exists() else 0
    regenerated = len(regen.read_text().splitlines())
    print(f"  {regenerated} rows (one per assistant turn), {failed} conversations failed")

    with timed(steps, "prepare-data"):
        run(
            speculators_cmd(
                "prepare-data", "--model", target.path, "--data", str(regen), "--output", str(prep),
                "--seq-length", str(cfg["tokenize"]["max_seq_len"]), "--no-skip-token-freq", *remote,
            ),
            scratch, logs / "prepare-data.log",
        )  # fmt: skip
    rows = load_from_disk(str(prep)).num_rows

    spec = vllm_extraction_spec(target.path, aux, n, scratch / "spool", base, env, cpu=cpu)
    with timed(steps, "generate-offline-data"), serving(spec, scratch, **no_key) as server:
        run(
            speculators_cmd(
                "generate-offline-data", "--endpoint", server.api_url, "--preprocessed-data", str(prep),
                "--validate-outputs",  # the tutorial's recommendation
            ),
            scratch, logs / "generate-offline-data.log",
        )  # fmt: skip
    stored = len(list((prep / "hidden_states").glob("hs_*.safetensors")))
    if stored != rows:  # it skips failed samples and exits 0
        raise SystemExit(f"generate-offline-data stored {stored} of {rows} samples; see {logs}")

    if train:
        with timed(steps, "train"):
            # `python -m eaglenest.training.train`: speculators' train entry point after eaglenest's CPU patches.
            run([sys.executable, "-m", "eaglenest.training.train", *train_args], scratch, logs / "train.log")
    done = epochs_done(ckpts) if train else []
    return {
        "steps_s": steps,
        "total_s": round(sum(steps.values()), 1),
        "train_rows": int(rows * flat["train_data_ratio"]),
        "epochs": len(done),
        "train_settings": settings,
        "draft": str(ckpts / str(done[-1])) if done else None,
        "data": str(prep),
    }


def steps_per_epoch(data_path: Path, total_seq_len: int, train_data_ratio: float, seed: int, epochs: int):
    """The optimizer steps speculators' trainer takes in each of `epochs` epochs on one rank:
    its own packing sampler over its own training split (the packing differs per epoch)."""
    from speculators.train.data import ArrowDataset
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2

    lengths = ArrowDataset(
        max_len=total_seq_len, datapath=str(data_path), on_missing="raise",
        train_ratio=train_data_ratio, split="train",
    ).approx_lengths  # fmt: skip
    sampler = MultipackDistributedBatchSamplerV2(
        batch_max_length=total_seq_len, lengths=lengths, num_replicas=1, rank=0, seed=seed
    )
    counts = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        counts.append(len(sampler))
    return counts


def epochs_for_budget(per_epoch: list[int], budget: int) -> int:
    """The fewest epochs whose steps reach `budget` (--max-steps stops the last one there)."""
    total = 0
    for epochs, steps in enumerate(per_epoch, 1):
        total += steps
        if total >= budget:
            return epochs
    raise SystemExit(f"{len(per_epoch)} epochs hold {total} steps, fewer than the budget {budget}")


def speculators_data_arm(cfg: dict, target, run_dir: Path, scratch: Path, data: Path, budget: int) -> dict:
    """Arm (b): speculators' prepared data (arm (a)'s) trained with eaglenest's settings and
    draft config for `budget` optimizer steps. speculators builds the vocabulary mapping from
    that data's own token counts (token_freq.pt), at eaglenest's draft vocabulary size."""
    from eaglenest.core.io import read_json
    from eaglenest.draft.algorithms import draft_algorithm
    from eaglenest.pipeline.workflow import resolve_device
    from eaglenest.training.checkpoints import epochs_done
    from eaglenest.training.metrics import METRICS_FILE_ENV, collect_metrics
    from eaglenest.training.sweep import train_settings
    from eaglenest.training.trainer import trainer_args

    hp = train_settings(cfg)
    per_epoch = steps_per_epoch(data, hp["total_seq_len"], hp["train_data_ratio"], hp["seed"], 1000)
    hp["epochs"] = epochs_for_budget(per_epoch, budget)
    draft_config = run_dir / "draft_config.json"
    dcfg = read_json(draft_config)
    ckpts, logs = scratch / "checkpoints_speculators_data", scratch / "logs"
    args = trainer_args(
        target=target.path, data_dir=data, save_path=ckpts, draft_config=draft_config,
        d2t_npy="", t2d_npy="", draft_vocab_size=dcfg["eaglenest"]["draft_vocab_size"],
        aux_layer_ids=dcfg["eaglenest"]["aux_layer_ids"], hp=hp,
        cpu=resolve_device(cfg["vllm"]["device"]) == "cpu", log_dir=logs / "speculators_data",
        trust_remote_code=target.trust_remote_code, algorithm=draft_algorithm(dcfg),
        mask_token_id=dcfg["eaglenest"].get("mask_token", {}).get("id"),
    )  # fmt: skip
    # No mapping files: speculators builds its own from the data it trains on.
    for flag in ("--d2t-path", "--t2d-path"):
        i = args.index(flag)
        del args[i : i + 2]
    args += ["--max-steps", str(budget)]
    print(
        f"  budget {budget} steps: {hp['epochs']} epochs of {per_epoch[: hp['epochs']]} steps, --max-steps {budget}"
    )
    metrics_file = scratch / "speculators_data_epoch_metrics.jsonl"
    steps: dict[str, float] = {}
    with timed(steps, "train (eaglenest settings)"):
        run(
            [sys.executable, "-m", "eaglenest.training.train", *args],
            scratch, logs / "train_speculators_data.log", env={METRICS_FILE_ENV: str(metrics_file)},
        )  # fmt: skip
    trained = sum(row["train_steps"] for row in collect_metrics(metrics_file))
    done = epochs_done(ckpts)
    return {
        "steps_s": steps,
        "train_steps": trained,
        "epochs": len(done),
        "draft": str(ckpts / str(done[-1])),
    }


def eaglenest_arm(cfg: dict, run_dir: Path) -> dict:
    from eaglenest.core.io import iter_jsonl, read_json

    with open(run_dir / "stage_times.csv") as f:
        wall = {r["stage"]: float(r["wall_s"]) for r in csv.DictReader(f)}
    missing = [s for s in EAGLENEST_STAGES if s not in wall]
    if missing:
        raise SystemExit(f"{run_dir / 'stage_times.csv'} has no {', '.join(missing)}: not a finished run?")
    steps = {s: wall[s] for s in EAGLENEST_STAGES}
    # A regeneration resumed from its progress file sent nothing: its time is a server start.
    done = re.findall(
        r"regeneration done: .*'sent': (\d+)", (run_dir / "logs" / "regenerate_responses.log").read_text()
    )
    if done and int(done[-1]) == 0:
        print(
            "  NOTE: the run's regenerate_responses resumed every answer: its time is not a full regeneration"
        )
    metrics = read_json(run_dir / "train" / "train_metrics.json")
    rows = metrics.get("train_rows")
    if rows is None:  # a run from before train_metrics.json recorded it
        tokenized = sum(1 for _ in iter_jsonl(run_dir / "tokenized" / "tokenized_data.jsonl"))
        rows = int(tokenized * cfg["train"]["train_data_ratio"])
    per_epoch = metrics["per_epoch"]
    if any("train_steps" not in row for row in per_epoch):
        raise SystemExit(
            f"{run_dir / 'train' / 'train_metrics.json'} does not count its optimizer steps "
            "(trained before eaglenest recorded them): rerun the workflow to retrain"
        )
    return {
        "steps_s": steps,
        "total_s": round(sum(steps.values()), 1),
        "train_rows": rows,
        "epochs": metrics["epochs"],
        "train_steps": sum(row["train_steps"] for row in per_epoch),
        "draft": str(run_dir / "draft"),
    }


def run_arms(names, cfg: dict, target, run_dir: Path, scratch: Path, spec_epochs, extra) -> dict:
    """The arms asked for, in ARMS' order: (c) first (its step count is (b)'s budget), then
    speculators' data steps once for (a) and (b)."""
    eaglenest = eaglenest_arm(cfg, run_dir)
    arms = {}
    if "speculators" in names or "speculators_data" in names:
        recipe = speculators_arm(
            cfg, target, run_dir, scratch, spec_epochs, extra, train="speculators" in names
        )
        if "speculators" in names:
            arms["speculators"] = recipe
        if "speculators_data" in names:
            print("\nspeculators' data, eaglenest's trainer settings:", flush=True)
            arm = speculators_data_arm(
                cfg, target, run_dir, scratch, Path(recipe["data"]), eaglenest["train_steps"]
            )
            data_steps = {k: v for k, v in recipe["steps_s"].items() if k != "train"}
            arm["steps_s"] = {**data_steps, **arm["steps_s"]}
            arm["total_s"] = round(sum(arm["steps_s"].values()), 1)
            arm["train_rows"] = recipe["train_rows"]
            arms["speculators_data"] = arm
    if "eaglenest" in names:
        arms["eaglenest"] = eaglenest
    return arms


def evaluate(arms: dict, cfg: dict, target, run_dir: Path, scratch: Path) -> None:
    """Each arm's draft on its own server, back to back, through eaglenest's evaluation stage
    (as a sweep's variant: the held-out prompts and the run's benchmarks, greedy outputs
    compared with the run's own no-speculation outputs)."""
    from eaglenest.evaluation.evaluate import evaluate_stage
    from eaglenest.pipeline.workflow import vllm_base_args, vllm_env

    ev = cfg["evaluate"]
    server_cfg = {
        "base_args": list(vllm_base_args(cfg["vllm"], cfg["target"])),
        "env": dict(vllm_env(cfg["vllm"])),
        "reuse": False,
        "startup_timeout_s": cfg["vllm"]["startup_timeout_s"],
        "stall_timeout_s": cfg["vllm"]["stall_timeout_s"],
    }
    print(
        f"\nevaluating on the held-out prompts and {', '.join(b['name'] for b in ev.get('benchmarks', [])) or 'no benchmark'}: "
        f"k {ev['num_speculative_tokens']}, max_tokens {ev['max_tokens']}, concurrency {ev['concurrency']}",
        flush=True,
    )
    for name, arm in arms.items():
        out = scratch / "eval" / name
        out.mkdir(parents=True, exist_ok=True)
        summary = evaluate_stage(
            run_dir=scratch, target=target, draft_dir=arm["draft"],
            prompts_path=run_dir / "prompts" / "eval_prompts.jsonl",
            benchmarks_path=run_dir / "prompts" / "benchmarks.jsonl",
            metadata_path=run_dir / "tokenized" / "metadata.json",
            server_cfg=server_cfg, k=ev["num_speculative_tokens"], max_tokens=ev["max_tokens"],
            concurrency=ev["concurrency"], ngram=ev["ngram"],
            out_json=out / "acceptance.json", out_csv=out / "acceptance.csv",
            out_png=out / "per_position.png", out_outputs=out / "outputs.jsonl",
            out_sets=out / "benchmarks.csv", methods=("draft",),
            reference_outputs=run_dir / "eval" / "outputs.jsonl",
        )  # fmt: skip
        result = summary["draft"]
        result["greedy_identical_to_no_spec"] = result["lossless"]
        result["benchmarks"] = {b: figs["draft"] for b, figs in summary["benchmarks"].items()}
        arm["acceptance"] = result
        on = "".join(f", {b} {f['mean_acceptance_length']:.3f}" for b, f in result["benchmarks"].items())
        print(
            f"  {name}: held-out {result['mean_acceptance_length']:.3f}{on} tokens per target step",
            flush=True,
        )


def per_pos(acceptance: dict, sep: str = " ") -> str:
    return sep.join(f"{x:.2f}" for x in acceptance["per_position_acceptance"] or [])


def arm_table(arms: dict) -> dict:
    """The arms side by side, as printed: a row per figure, a column per arm."""
    rows = [
        ("wall s to a draft", lambda a: f"{a['total_s']:.1f}"),
        ("training rows", lambda a: a["train_rows"]),
        ("epochs", lambda a: a["epochs"]),
        ("optimizer steps", lambda a: a.get("train_steps", "")),
        ("tokens per target step", lambda a: f"{a['acceptance']['mean_acceptance_length']:.3f}"),
        ("acceptance length/draft", lambda a: f"{a['acceptance']['mean_acceptance_length_per_draft']:.3f}"),
        ("acceptance rate", lambda a: f"{a['acceptance']['acceptance_rate']:.3f}"),
        ("per-position acceptance", lambda a: per_pos(a["acceptance"])),
        ("output tokens/s", lambda a: a["acceptance"]["output_tokens_per_s"]),
        ("greedy = no speculation", lambda a: a["acceptance"]["greedy_identical_to_no_spec"]),
    ]
    for bench in next(iter(arms.values()))["acceptance"].get("benchmarks", {}):
        rows.append(
            (
                f"{bench}: tokens per step",
                lambda a, b=bench: f"{a['acceptance']['benchmarks'][b]['mean_acceptance_length']:.3f}",
            )
        )
    return {
        "columns": ["", *arms],
        "rows": [[label, *(value(a) for a in arms.values())] for label, value in rows],
    }


def data_ratios(arms: dict) -> dict:
    """The data pipeline's worth at equal training: (c)'s tokens per target step over (b)'s,
    per prompt set (none unless both arms ran)."""
    if not ("eaglenest" in arms and "speculators_data" in arms):
        return {}
    c, b = arms["eaglenest"]["acceptance"], arms["speculators_data"]["acceptance"]
    sets = {"held out": (c, b)} | {n: (c["benchmarks"][n], b["benchmarks"][n]) for n in c["benchmarks"]}
    return {n: x["mean_acceptance_length"] / y["mean_acceptance_length"] for n, (x, y) in sets.items()}


def report(arms: dict, stored: dict) -> list[dict]:
    """Prints each arm's steps, the arms side by side and the data pipeline's worth; returns
    the two tables (the arms, then each step's wall seconds)."""
    for name, arm in arms.items():
        print(f"\n{name} steps (wall s{', Snakemake benchmark files' if name == 'eaglenest' else ''}):")
        for step, s in arm["steps_s"].items():
            print(f"  {step:<24} {s:8.1f}")
    draft = stored.get("draft", {})
    print(
        f"\neaglenest's own evaluation of its draft (eval/acceptance.json): "
        f"{draft.get('mean_acceptance_length', float('nan')):.3f} tokens per target step, "
        f"{draft.get('output_tokens_per_s')} tok/s"
    )
    table = arm_table(arms)
    print(f"\n{'':<26}" + "".join(f"{name:>22}" for name in arms))
    for label, *values in table["rows"]:
        print(f"{label:<26}" + "".join(f"{v!s:>22}" for v in values))
    ratios = data_ratios(arms)
    if ratios:
        print(
            "\neaglenest / speculators' data at equal steps (tokens per target step): "
            + ", ".join(f"{n} {r:.3f}x" for n, r in ratios.items())
        )
    steps = [[name, step, s] for name, arm in arms.items() for step, s in arm["steps_s"].items()]
    return [
        table,
        {"title": "Each arm's steps, wall seconds", "columns": ["arm", "step", "s"], "rows": steps},
    ]


def arm_figures(arms: dict) -> dict:
    """The record's figures: each arm's held-out tokens per target step first (the docs list
    an earlier run by its first four figures), then the data pipeline's worth, then the rest."""
    figures = {}

    def put(arm: str, what: str, value) -> None:
        name = ARM_FIGURE[arm].format(what)
        figures[RECORDED_NAMES.get(name, name)] = value

    for arm, a in arms.items():
        put(arm, "tokens per target step, held out", round(a["acceptance"]["mean_acceptance_length"], 3))
    for name, ratio in data_ratios(arms).items():
        figures[f"eaglenest's data against speculators', {BENCH_NAMES.get(name, name)} (x)"] = round(ratio, 3)
    for arm, a in arms.items():
        acceptance = a["acceptance"]
        for bench, f in acceptance.get("benchmarks", {}).items():
            what = f"tokens per target step, {BENCH_NAMES.get(bench, bench)}"
            put(arm, what, round(f["mean_acceptance_length"], 3))
        put(arm, "per-position acceptance, held out", per_pos(acceptance, " / "))
        put(arm, "output tokens/s, held out", acceptance["output_tokens_per_s"])
        put(arm, "wall to a draft (s)", round(a["total_s"]))
        put(arm, "training rows", a["train_rows"])
        if a.get("train_steps"):
            put(arm, "optimizer steps", a["train_steps"])
        put(arm, "lossless", acceptance["greedy_identical_to_no_spec"])
    return figures


def record_run(args, ev: dict, arms: dict, tables: list[dict], commit: str) -> None:
    """The run's figures and tables, added to the record `vs_speculators`."""
    title = (
        f"The arms on {' + '.join(map(repo_path, args.configfile))}, served back to back by eaglenest's "
        f"evaluation (k {ev['num_speculative_tokens']}, max_tokens {ev['max_tokens']}, greedy; "
        f"speculators' epochs {args.spec_epochs or 'its default'})"
    )
    tables = [{"title": title, **tables[0]}, *tables[1:]]
    path = append_run(
        "vs_speculators", arm_figures(arms), command=command_line(), tables=tables, commit=commit
    )
    print(f"recorded in {repo_path(path)}; run `make docs`")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, required=True, help="working directory of a finished run")
    ap.add_argument(
        "--configfile",
        nargs="+",
        default=[str(REPO / "config" / "config.yaml")],
        help="the run's config files, merged in order as snakemake --configfile merges them",
    )
    ap.add_argument(
        "--arms", nargs="+", choices=ARMS, default=list(ARMS), help="which arms to run (default: all three)"
    )
    ap.add_argument("--spec-epochs", type=int, help="speculators' epochs (default: its own, 20)")
    ap.add_argument("--spec-train-args", default="", help="more train flags, e.g. '--num-workers 2'")
    ap.add_argument("--record", action="store_true", help="add this run to the record `vs_speculators`")
    args = ap.parse_args()
    commit = head_commit() if args.record else None  # the commit measured, before the long run

    from snakemake.utils import validate

    from eaglenest.pipeline.run_config import load_config

    cfg = load_config(REPO, REPO / "Snakefile", args.configfile)
    validate(cfg, str(REPO / "config" / "schemas" / "config.schema.yaml"))  # fills the defaults
    workdir = args.workdir.resolve()
    run_dir = workdir / cfg["run_dir"]
    scratch = run_dir / "bench_vs_speculators"
    shutil.rmtree(scratch, ignore_errors=True)  # every step is timed from nothing
    scratch.mkdir(parents=True)

    from eaglenest.engine.server import engine_env, socket_dir

    # Caches, temp files and sockets of this process and every one it starts stay in scratch;
    # the target is a local folder, so nothing needs the hub.
    os.environ.update({"HF_HUB_OFFLINE": "1", "HF_HOME": str(scratch / ".eaglenest" / "cache" / "hf")})
    os.environ.update(engine_env(scratch))

    from eaglenest.core.io import read_json
    from eaglenest.target.resolve import load_target

    target = load_target(run_dir / "target.json")
    stored = read_json(run_dir / "eval" / "acceptance.json")
    ev = cfg["evaluate"]
    k, max_tokens = stored["num_speculative_tokens"], stored["max_tokens"]
    if (k, max_tokens) != (ev["num_speculative_tokens"], ev["max_tokens"]):
        print(f"note: the run's own evaluation used k {k}, max_tokens {max_tokens}; this one the config's")
    if args.spec_epochs:
        print(f"speculators' epochs OVERRIDDEN: {args.spec_epochs} (its default is 20)")
    extra = shlex.split(args.spec_train_args)
    if extra:
        print(f"speculators train flags ADDED: {shlex.join(extra)}")
    print(
        f"target {target.path}; draft vocabulary {cfg['vocab']['draft_vocab_size']} in every arm "
        f"(eaglenest's, so that it is not what differs)\n\nspeculators recipe in {scratch}:",
        flush=True,
    )
    try:
        arms = run_arms(args.arms, cfg, target, run_dir, scratch, args.spec_epochs, extra)
        evaluate(arms, cfg, target, run_dir, scratch)
    finally:
        if not socket_dir(scratch).is_relative_to(scratch.resolve()):  # a short one in /tmp
            shutil.rmtree(socket_dir(scratch), ignore_errors=True)
    tables = report(arms, stored)
    out = scratch / "bench_vs_speculators.json"
    out.write_text(json.dumps({"workdir": str(workdir), "config": args.configfile, **arms}, indent=2))
    print(f"\nwritten: {out}")
    if args.record:
        record_run(args, ev, arms, tables, commit)


if __name__ == "__main__":
    main()
