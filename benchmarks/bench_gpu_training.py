"""The training half of the GPU path, alone: eaglenest's train_draft stage and export on
synthetic hidden states, at the Kimi-K2.5 draft's shape, on one machine without vLLM or a
network.

What it runs is the stage a real run runs (eaglenest.training.train.train_stage: the
speculators-internals check, every shard verified against its manifest, the contracts between
the inputs, speculators' trainer with its GPU defaults, flex attention and the fused Triton
loss, and the checkpoint checks), then eaglenest.evaluation.export.export_stage. Only the
inputs are made up: a target folder that holds just what the trainer reads of a target (its
config, and random embeddings, LM head and final norm at the target's shape), tokenized rows of
random ids, the vocabulary mapping from their counts, and random bfloat16 hidden states, stored
by the extraction stage's own shard writer. The draft config is derived from that target
(`--shape kimi`: Kimi-K2.5's hidden size 7,168, vocabulary 163,840, 64 heads, YaRN rope).

It trains 2 epochs and is killed once the first epoch's checkpoint is whole, then run again:
the rerun must resume from that checkpoint and train only the second epoch, as after a
preemption. It prints each phase's seconds, the training tokens per second, the GPU memory the
trainer held at its peak (nvidia-smi, sampled), the checkpoint's size, and each check. With
--record (Kimi's shape only) the run's figures and checks are added to the record
`gpu_training` (benchmarks/records/, with date, commit, machine, command, versions; records.py
needs only the standard library); on a copied tree without git, name the commit measured with
--commit. Bring benchmarks/records/gpu_training.json back and run `make docs`.

On a GPU machine without network, carry the wheels it needs beside it (made where the package
registry is reachable, with the versions in envs/constraints-gpu.txt):
    pip download --no-deps -d wheels speculators hs-connectors datasets dill multiprocess \
        loguru pydantic-settings python-dotenv
    pip install --no-index --find-links wheels speculators hs-connectors datasets
    pip install --no-deps -e .
CPU at tiny shapes (what the test suite runs): python benchmarks/bench_gpu_training.py --shape tiny

Usage: python benchmarks/bench_gpu_training.py [--shape kimi|tiny] [--samples N] [--seq-len L]
                                              [--workdir DIR] [--record [--commit SHA]]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from records import append_run, command_line, head_commit, repo_path
from safetensors.torch import save_file

from eaglenest.core.io import iter_jsonl, write_jsonl
from eaglenest.data.vocab import MappingPaths, build_vocab_mapping
from eaglenest.draft.aux_layers import default_aux_layer_ids
from eaglenest.draft.config import draft_config_stage
from eaglenest.evaluation.export import export_stage
from eaglenest.hidden_states.extract import write_shard
from eaglenest.target.resolve import resolve_target
from eaglenest.training.checkpoints import checkpoint_problem, epochs_done
from eaglenest.training.train import train_stage

SHAPES = {
    # Kimi-K2.5's text model as the draft sees it (its config.json's text_config).
    "kimi": dict(
        hidden_size=7168,
        vocab_size=163840,
        num_hidden_layers=61,
        num_attention_heads=64,
        num_key_value_heads=64,
        intermediate_size=18432,
        rms_norm_eps=1e-6,
        max_position_embeddings=262144,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 50000.0,
            "factor": 64.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
        },
        draft_vocab_size=32000,
        samples=64,
        seq_len=2048,
        total_seq_len=8192,
    ),
    "tiny": dict(
        hidden_size=64,
        vocab_size=512,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        rms_norm_eps=1e-6,
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        draft_vocab_size=128,
        samples=12,
        seq_len=48,
        total_seq_len=128,
    ),
}
TRAINER_DEFAULTS = {  # config/kimi-k2.5.yaml's train section, 2 epochs
    "draft_layers": 1,
    "epochs": 2,
    "lr": 1e-4,
    "optimizer": "adamw",
    "ttt_steps": 3,
    "dtype": "bfloat16",
    "train_data_ratio": 0.75,
    "num_workers": 2,
    "scheduler": "cosine",
    "seed": 0,
}


def make_target(folder: Path, shape: dict) -> Path:
    """A folder holding what the trainer reads of a target: config, embeddings, LM head, norm."""
    folder.mkdir(parents=True)
    keys = ("hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads")
    keys += ("num_key_value_heads", "intermediate_size", "rms_norm_eps", "max_position_embeddings")
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **{k: shape[k] for k in keys},
        "rope_parameters": shape["rope_parameters"],
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    g = torch.Generator().manual_seed(0)
    v, h = shape["vocab_size"], shape["hidden_size"]
    weights = {
        "model.embed_tokens.weight": (torch.randn(v, h, generator=g) * 0.02).to(torch.bfloat16),
        "lm_head.weight": (torch.randn(v, h, generator=g) * 0.02).to(torch.bfloat16),
        "model.norm.weight": torch.ones(h, dtype=torch.bfloat16),
    }
    save_file(weights, str(folder / "model.safetensors"))
    return folder


def make_data(work: Path, shape: dict, samples: int, seq_len: int, num_shards: int = 2) -> dict:
    """Tokenized rows, their token counts and vocabulary mapping, and hidden-state shards."""
    g = torch.Generator().manual_seed(1)
    v, h = shape["vocab_size"], shape["hidden_size"]
    rows = []
    for i in range(samples):
        ids = torch.randint(0, v, (seq_len,), generator=g).tolist()
        prompt = seq_len // 4  # the assistant's part carries the loss, as tokenize writes it
        rows.append({"id": str(i), "input_ids": ids, "loss_mask": [0] * prompt + [1] * (seq_len - prompt)})
    tokenized = work / "tokenized" / "tokenized_data.jsonl"
    tokenized.parent.mkdir(parents=True)
    write_jsonl(tokenized, rows)
    counts = torch.bincount(torch.tensor([t for r in rows for t in r["input_ids"]]), minlength=v)
    torch.save(counts, work / "tokenized" / "token_freq.pt")
    paths = MappingPaths.in_dir(work / "vocab")
    build_vocab_mapping(
        work / "tokenized" / "token_freq.pt", shape["draft_vocab_size"], paths, target_vocab_size=v
    )
    shards = []
    for k in range(num_shards):
        start, stop = k * samples // num_shards, (k + 1) * samples // num_shards
        states = (
            (
                i,
                torch.randn(seq_len, 4, h, generator=g).to(torch.bfloat16),
                torch.tensor(rows[i]["input_ids"]),
            )
            for i in range(start, stop)
        )
        out = work / "hidden_states" / f"shard_{k}"
        out.parent.mkdir(exist_ok=True)
        meta = {
            "aux_layer_ids": default_aux_layer_ids(shape["num_hidden_layers"]),
            "shard": k,
            "num_shards": num_shards,
        }
        write_shard(out, states, rows=(start, stop), hidden_size=h, dtype="bfloat16", meta=meta)
        shards.append(out)
    return {"tokenized": tokenized, "vocab": paths, "shards": shards}


class GpuMemory:
    """The most GPU memory in use while it runs, sampled from nvidia-smi (None without one)."""

    def __init__(self, every_s: float = 0.5):
        self.peak_mib, self._stop = None, threading.Event()
        if shutil.which("nvidia-smi"):
            self._thread = threading.Thread(target=self._poll, args=(every_s,), daemon=True)
            self._thread.start()

    def _poll(self, every_s):
        while not self._stop.wait(every_s):
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
            ).stdout.split()
            if out:
                self.peak_mib = max(self.peak_mib or 0, max(int(x) for x in out))

    def stop(self):
        self._stop.set()
        return self.peak_mib


def stage_kwargs(work: Path, data: dict, target, hp: dict) -> dict:
    for folder in ("logs", "draft"):  # Snakemake makes its outputs' folders
        (work / folder).mkdir(exist_ok=True)
    return dict(
        run_dir=work,
        target=target,
        shard_dirs=[str(s) for s in data["shards"]],
        tokenized_path=data["tokenized"],
        t2d_npy=data["vocab"].t2d_npy,
        d2t_npy=data["vocab"].d2t_npy,
        draft_config_path=work / "vocab" / "draft_config.json",
        hp=hp,
        gpus=1,
        device="auto",
        out_checkpoint=work / "draft" / "checkpoint",
        out_metrics=work / "draft" / "train_metrics.json",
        out_curves=work / "draft" / "train_curves.png",
        log_file=work / "logs" / "train_draft.log",
    )


def train_until_first_checkpoint(work: Path, spec: dict, timeout_s: float) -> float:
    """train_stage in a child process, killed (its whole process group, as a preemption
    would) once the first epoch's checkpoint is whole; returns its seconds."""
    code = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "sys.path.insert(0, str(Path(sys.argv[1]).parent))\n"
        "from bench_gpu_training import rerun_spec\n"
        "rerun_spec(Path(sys.argv[2]))\n"
    )
    spec_file = work / "stage_spec.json"
    spec_file.write_text(json.dumps(spec))
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", code, __file__, str(spec_file)], start_new_session=True)
    save_path = next((work / ".eaglenest" / "train").glob("*/checkpoints"), None)
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            raise SystemExit(f"training ended before its first checkpoint (exit {proc.returncode})")
        save_path = save_path or next((work / ".eaglenest" / "train").glob("*/checkpoints"), None)
        if save_path and epochs_done(save_path) and not checkpoint_problem(save_path / "0"):
            break
        time.sleep(1)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        raise SystemExit(f"no whole checkpoint after {timeout_s:.0f} s")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return time.monotonic() - t0


def rerun_spec(spec_file: Path) -> dict:
    """train_stage from a spec written by this script (the child process's entry)."""
    spec = json.loads(spec_file.read_text())
    work = Path(spec["work"])
    data = {
        "tokenized": Path(spec["tokenized"]),
        "vocab": MappingPaths.in_dir(work / "vocab"),
        "shards": [Path(s) for s in spec["shards"]],
    }
    target = resolve_target(spec["target"])
    return train_stage(**stage_kwargs(work, data, target, spec["hp"]))


def record_commit(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str | None:
    """The commit a --record run measures, named before the run (None without --record)."""
    if not args.record:
        return None
    if args.shape != "kimi":
        parser.error("--record: the record `gpu_training` holds the Kimi shape's runs")
    try:
        return args.commit or head_commit()
    except RuntimeError as e:
        parser.error(f"--record: {e} with --commit")


def record_run(measured: dict, checks: dict, commit: str) -> None:
    """The run's figures and its checks, added to the record `gpu_training`."""
    passed = sum(checks.values())
    figures = {**measured, "checks passed": "all" if passed == len(checks) else f"{passed} of {len(checks)}"}
    rows = [[name, "ok" if ok else "FAIL"] for name, ok in checks.items()]
    tables = [{"title": "Checks", "columns": ["check", "result"], "rows": rows}]
    path = append_run("gpu_training", figures, command=command_line(), tables=tables, commit=commit)
    print(f"recorded in {repo_path(path)}; bring it back and run `make docs`")


def parse_args(argv=None) -> tuple[argparse.Namespace, str | None]:
    """The arguments, and the commit a --record run measures (None without --record)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="kimi")
    parser.add_argument("--samples", type=int)
    parser.add_argument("--seq-len", type=int)
    parser.add_argument("--workdir", type=Path, help="default: a temporary folder, removed after")
    parser.add_argument("--timeout-s", type=float, default=1800)
    parser.add_argument("--record", action="store_true", help="add this run to the record `gpu_training`")
    parser.add_argument("--commit", help="with --record: the commit measured (default: this checkout's)")
    args = parser.parse_args(argv)
    return args, record_commit(parser, args)


def make_inputs(work: Path, shape: dict, samples: int, seq_len: int) -> tuple[Path, dict, object, float]:
    """The made-up target, data and draft config; their seconds."""
    t = time.monotonic()
    target_dir = make_target(work / "target", shape)
    data = make_data(work, shape, samples, seq_len)
    target = resolve_target(str(target_dir))
    dcfg = draft_config_stage(
        target_dir,
        work / "vocab" / "draft_config.json",
        aux_layer_ids=default_aux_layer_ids(shape["num_hidden_layers"]),
        draft_vocab_size=shape["draft_vocab_size"],
        max_position_embeddings=shape["total_seq_len"],
    )
    made = time.monotonic() - t
    print(f"inputs made: {made:.1f} s (draft rope: {dcfg.get('rope_parameters')})")
    return target_dir, data, target, made


def train_and_resume(work: Path, target_dir: Path, data: dict, target, hp: dict, timeout_s: float,
                     measured: dict, checks: dict) -> None:  # fmt: skip
    """Training killed once its first epoch's checkpoint is whole, then rerun: it must resume
    and train only the second epoch. Adds its figures to `measured` and its checks to `checks`."""
    spec = {
        "work": str(work),
        "target": str(target_dir),
        "tokenized": str(data["tokenized"]),
        "shards": [str(s) for s in data["shards"]],
        "hp": hp,
    }
    memory = GpuMemory()
    first = train_until_first_checkpoint(work, spec, timeout_s)
    print(f"epoch 0 (killed once its checkpoint was whole): {first:.1f} s")
    t = time.monotonic()
    summary = train_stage(**stage_kwargs(work, data, target, hp))
    resumed = time.monotonic() - t
    peak = memory.stop()
    rows = list(iter_jsonl(data["tokenized"]))
    train_tokens = sum(len(r["input_ids"]) for r in rows) * hp["train_data_ratio"]
    print(
        f"rerun, resumed: {resumed:.1f} s for epoch {summary['final_epoch']}, about "
        f"{train_tokens / resumed:,.0f} training tokens/s, the trainer's start-up included"
    )
    print(f"GPU memory at its peak: {peak} MiB" if peak is not None else "GPU memory: no nvidia-smi")
    measured["epoch 0 (s)"] = round(first)
    measured["resumed epoch (s)"] = round(resumed)
    measured["training tokens/s, resumed epoch, start-up included"] = round(train_tokens / resumed)
    if peak is not None:
        measured["peak GPU memory (GB)"] = round(peak * 2**20 / 1e9, 1)
    measured[f"epoch 0 rows ({len(rows[0]['input_ids']):,} tokens each)"] = summary["train_rows"]
    checks["resumed from epoch 0, trained epoch 1 only"] = (
        summary["resumed_from_epoch"] == 0 and summary["final_epoch"] == 1
    )
    checkpoint = work / "draft" / "checkpoint"
    (epoch,) = (work / ".eaglenest" / "train").glob(f"*/checkpoints/{summary['final_epoch']}")
    checks["the kept epoch checkpoint is whole (model, config, optimizer)"] = (
        checkpoint_problem(epoch) is None
    )
    mb = {p: sum(f.stat().st_size for f in p.iterdir()) / 1e6 for p in (checkpoint, epoch)}
    print(f"draft checkpoint: {mb[checkpoint]:.1f} MB; the epoch's, with optimizer state: {mb[epoch]:.1f} MB")
    measured["draft checkpoint (GB)"] = round(mb[checkpoint] / 1e3, 2)
    measured["draft checkpoint with optimizer state (GB)"] = round(mb[epoch] / 1e3, 2)


def export_and_check(work: Path, data: dict, target, shape: dict, hp: dict, device: str,
                     measured: dict, checks: dict) -> None:  # fmt: skip
    """The export of the trained draft, timed, and the checks on it and on the trainer's flags."""
    n = shape["num_hidden_layers"]
    t = time.monotonic()
    exported = export_stage(
        work / "draft" / "checkpoint",
        work / "export",
        t2d_pt=data["vocab"].t2d_pt,
        d2t_pt=data["vocab"].d2t_pt,
        draft_config_path=work / "vocab" / "draft_config.json",
        target=target,
        max_model_len=shape["total_seq_len"],
        hp=hp,
    )
    measured["export (s)"] = round(time.monotonic() - t, 1)
    print(f"export: {measured['export (s)']:.1f} s")
    config = json.loads((work / "export" / "config.json").read_text())
    checks["export names the target's aux layers and draft vocabulary"] = (
        config.get("eagle_aux_hidden_state_layer_ids") == default_aux_layer_ids(n)
        and config.get("draft_vocab_size") == shape["draft_vocab_size"]
    )
    layer = exported["transformer_layer_config"]
    checks["the exported draft keeps the target's rope (YaRN for Kimi)"] = all(
        layer.get("rope_parameters", {}).get(k) == v for k, v in shape["rope_parameters"].items()
    )
    logs = (work / "logs" / "train_draft.log").read_text()
    if device == "cuda":
        checks["trainer ran with its GPU defaults (no eager loss, no sdpa)"] = (
            "--loss-implementation eager" not in logs and "--draft-attn-impl sdpa" not in logs
        )


def main(argv=None) -> int:
    args, commit = parse_args(argv)
    shape = SHAPES[args.shape]
    samples, seq_len = args.samples or shape["samples"], args.seq_len or shape["seq_len"]
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-gpu-training-"))
    work.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(
        f"shape {args.shape}: hidden {shape['hidden_size']}, vocabulary {shape['vocab_size']} "
        f"(draft {shape['draft_vocab_size']}), {samples} samples x {seq_len} tokens, device {device}"
        + (f" ({torch.cuda.get_device_name()})" if device == "cuda" else "")
    )
    checks, measured = {}, {}  # measured: the record's figures, named as its earlier runs name them
    try:
        target_dir, data, target, made = make_inputs(work, shape, samples, seq_len)
        hp = {**TRAINER_DEFAULTS, "total_seq_len": shape["total_seq_len"]}
        train_and_resume(work, target_dir, data, target, hp, args.timeout_s, measured, checks)
        export_and_check(work, data, target, shape, hp, device, measured, checks)
        measured["inputs made (s)"] = round(made, 1)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    for name, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    if commit:
        record_run(measured, checks, commit)
    return 0 if checks and all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
