"""The hidden-state modes side by side on one config: peak disk, stage times, acceptance.

Builds the shared upstream once (target, prompts, regeneration, tokenization, vocabulary), then
runs the rest of the pipeline in each mode in the same working directory, as a user switching
`hidden_states.mode` would: offline (bfloat16), online, hybrid, and offline in fp8
(`hidden_states.dtype: float8_e4m3fn`). Before each mode the previous mode's hidden states
(shards, hybrid's kept samples) are deleted, so each mode's peak is its own.

While a mode runs, a sampler adds up the bytes under the run folder every 0.5 s: the peak of
the whole folder, and of its hidden-state files alone (shards, the engine's spool, hybrid's kept
samples). Stage times come from the run's stage_times.csv (Snakemake's `benchmark:` files),
acceptance and losslessness from eval/acceptance.json (k from the config).

Prints one table, and writes it as JSON with `--json`.

Usage: python benchmarks/bench_hidden_state_modes.py [--workdir /tmp/eaglenest-modes]
         [--configfile config/config.yaml] [--modes offline,online,hybrid,fp8] [--json OUT]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
MODES = {
    "offline": {"mode": "offline"},
    "online": {"mode": "online"},
    "hybrid": {"mode": "hybrid"},
    "fp8": {"mode": "offline", "dtype": "float8_e4m3fn"},
}
STAGES = ["plan_hidden_states", "extract_hidden_states", "train_draft", "export_draft", "evaluate_acceptance"]


def folder_bytes(root: Path) -> tuple[int, int]:
    """(all bytes under `root`, bytes of hidden-state files), without following links."""
    total = hidden = 0
    for dirpath, _dirs, files in os.walk(root):
        in_hs = (
            "/hidden_states" in dirpath or "hidden_states_spool" in dirpath or "hidden_states_kept" in dirpath
        )
        for name in files:
            try:
                size = os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue  # removed while we walked
            total += size
            if in_hs and (".safetensors" in name):
                hidden += size
    return total, hidden


class DiskSampler(threading.Thread):
    def __init__(self, root: Path, every_s: float = 0.5):
        super().__init__(daemon=True)
        self.root, self.every_s = root, every_s
        self.peak_total = self.peak_hidden = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            total, hidden = folder_bytes(self.root)
            self.peak_total, self.peak_hidden = max(self.peak_total, total), max(self.peak_hidden, hidden)
            self.stop.wait(self.every_s)


def snakemake(workdir: Path, configfile: Path, *args: str) -> None:
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(workdir)]
    cmd += ["--configfile", str(configfile), "--cores", "2", *args]
    with open(workdir / "bench.log", "a") as log:
        log.write(f"\n$ {' '.join(cmd)}\n")
        log.flush()
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)


def stage_seconds(run_dir: Path) -> dict[str, float]:
    with open(run_dir / "stage_times.csv") as f:
        return {row["stage"]: float(row["wall_s"]) for row in csv.DictReader(f)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/eaglenest-modes"))
    ap.add_argument("--configfile", type=Path, default=REPO / "config" / "config.yaml")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    base = yaml.safe_load(args.configfile.read_text())
    run_dir = args.workdir / base["run_dir"]
    # The shared upstream: what no mode reruns.
    upstream_config = args.workdir / "upstream.yaml"
    upstream_config.write_text(yaml.safe_dump(base, sort_keys=False))
    t0 = time.monotonic()
    snakemake(
        args.workdir, upstream_config, f"{base['run_dir']}/tokenized/tokenized_data.jsonl",
        f"{base['run_dir']}/vocab/t2d.npy", f"{base['run_dir']}/draft_config.json",
    )  # fmt: skip
    print(f"shared upstream built in {time.monotonic() - t0:.0f} s", flush=True)
    rows = []
    for name in args.modes.split(","):
        cfg = json.loads(json.dumps(base))
        cfg["hidden_states"].update(MODES[name])
        configfile = args.workdir / f"{name}.yaml"
        configfile.write_text(yaml.safe_dump(cfg, sort_keys=False))
        for old in [*run_dir.glob("hidden_states/shard_*"), run_dir / ".eaglenest" / "hidden_states_kept"]:
            shutil.rmtree(old, ignore_errors=True)
        sampler = DiskSampler(run_dir)
        sampler.start()
        t0 = time.monotonic()
        snakemake(args.workdir, configfile)
        wall = time.monotonic() - t0
        sampler.stop.set()
        sampler.join()
        acc = json.loads((run_dir / "eval" / "acceptance.json").read_text())
        row = {
            "mode": name,
            "wall_s": round(wall, 1),
            "peak_run_folder_bytes": sampler.peak_total,
            "peak_hidden_state_bytes": sampler.peak_hidden,
            "stages_s": {s: v for s, v in stage_seconds(run_dir).items() if s in STAGES},
            "tokens_per_step": round(acc["draft"]["mean_acceptance_length"], 3),
            "lossless": acc["draft"]["lossless"],
            "k": acc["num_speculative_tokens"],
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    header = f"{'mode':<8} {'peak run dir':>13} {'peak hidden':>12} " + " ".join(
        f"{s[:10]:>10}" for s in STAGES
    )
    header += f" {'tok/step':>8} lossless"
    print("\n" + header)
    for r in rows:
        stages = " ".join(f"{r['stages_s'].get(s, 0):>10.1f}" for s in STAGES)
        print(
            f"{r['mode']:<8} {r['peak_run_folder_bytes'] / 1e6:>10.1f} MB {r['peak_hidden_state_bytes'] / 1e6:>9.1f} MB "
            f"{stages} {r['tokens_per_step']:>8.3f} {r['lossless']}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
