"""Repeated kills: the default pipeline, SIGKILLed N times at seeded random moments, resumed each
time as docs/reference/troubleshooting.md says, then compared with an uninterrupted run.

Each round starts `snakemake --cores all` (with `--rerun-incomplete` after the first kill) in a
fresh working directory, sends SIGKILL to Snakemake's whole process group (a lost node, the OOM
killer) a random number of seconds after the start, waits until the run's vLLM servers are gone
(their supervisor stops them), and runs `snakemake --unlock`. After the last kill the run goes to
the end. Then it compares, with the uninterrupted reference run:

- every deterministic artifact, by sha256: prompts, regenerated responses, tokenized data, token
  counts, vocabulary mapping, draft config, every hidden-state file;
- the trained draft's acceptance (tokens per target step, k = 3) and losslessness (training is
  resumed from its last epoch checkpoint, so its weights need not be bit-identical).

Prints the seed, each kill's moment and the stage it hit, the kills survived, and every
difference. The reference is an uninterrupted run of the same config: one made here first
(default), or `--reference WORKDIR` (a workdir holding one, e.g. from an earlier benchmark).

Usage: python benchmarks/chaos.py [--kills 5] [--seed 0] [--min-s 20] [--max-s 240]
                                  [--workdir /tmp/eaglenest-chaos] [--reference WORKDIR]
                                  [--target BUILT_TINY_TARGET]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
DETERMINISTIC = (
    "prompts/prompts.jsonl",
    "prompts/eval_prompts.jsonl",
    "responses/raw_responses.jsonl",
    "tokenized/tokenized_data.jsonl",
    "tokenized/token_freq.pt",
    "vocab/t2d.npy",
    "vocab/d2t.npy",
    "draft_config.json",
    "hidden_states/shard_*/hs_*.safetensors",
)


def snakemake_cmd(workdir: Path, configfile: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(workdir),
            "--configfile", str(configfile), "--cores", "all", *extra]  # fmt: skip


def running_stage(run_dir: Path) -> str:
    """The stages whose logs were written last (what the kill interrupted)."""
    logs = (
        sorted((run_dir / "logs").rglob("*.log"), key=lambda p: p.stat().st_mtime)
        if (run_dir / "logs").exists()
        else []
    )
    return (
        logs[-1].relative_to(run_dir / "logs").as_posix().removesuffix(".log")
        if logs
        else "(before any stage)"
    )


def servers_gone(run_dir: Path, timeout: float = 120) -> bool:
    from eaglenest.engine.server import pid_alive

    starts = run_dir / ".eaglenest" / "server" / "starts.log"
    pids = [json.loads(line)["pid"] for line in starts.read_text().splitlines()] if starts.exists() else []
    deadline = time.monotonic() + timeout
    while any(pid_alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def run_to_end(workdir: Path, configfile: Path, *extra: str) -> float:
    t0 = time.monotonic()
    with open(workdir / "final-round.log", "w") as log:
        rc = subprocess.run(
            snakemake_cmd(workdir, configfile, *extra), stdout=log, stderr=subprocess.STDOUT
        ).returncode
    if rc != 0:
        raise SystemExit(f"the run did not finish (exit {rc}); see {workdir / 'final-round.log'}")
    return time.monotonic() - t0


def chaos_run(workdir: Path, configfile: Path, run_dir: Path, kills: list[float]) -> list[dict]:
    rounds = []
    for k, delay in enumerate(kills):
        extra = ["--rerun-incomplete"] if k else []
        with open(workdir / f"round-{k}.log", "w") as log:
            cmd = snakemake_cmd(workdir, configfile, *extra)
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            t0 = time.monotonic()
            while proc.poll() is None and time.monotonic() - t0 < delay:
                time.sleep(0.2)
            if proc.poll() is not None:
                ended = {
                    "kill": k,
                    "at_s": delay,
                    "hit": "nothing: the run had ended",
                    "exit": proc.returncode,
                }
                rounds.append(ended)
                break
            hit = running_stage(run_dir)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        gone = servers_gone(run_dir)
        subprocess.run(snakemake_cmd(workdir, configfile, "--unlock"), capture_output=True, check=True)
        rounds.append({"kill": k, "at_s": round(delay, 1), "hit": hit, "servers_stopped": gone})
        print(
            f"kill {k + 1}: {delay:.1f} s into round {k + 1}, during {hit}; servers stopped: {gone}",
            flush=True,
        )
    return rounds


def digests(run_dir: Path) -> dict[str, str]:
    out = {}
    for pattern in DETERMINISTIC:
        for p in sorted(run_dir.glob(pattern)):
            out[p.relative_to(run_dir).as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def acceptance(run_dir: Path) -> dict:
    acc = json.loads((run_dir / "eval" / "acceptance.json").read_text())
    return {
        m: (round(acc[m]["mean_acceptance_length"], 3), acc[m]["lossless"])
        for m in ("draft", "untrained_draft", "ngram")
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-s", type=float, default=20.0, help="earliest kill, seconds into a round")
    p.add_argument("--max-s", type=float, default=240.0, help="latest kill, seconds into a round")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/eaglenest-chaos"))
    p.add_argument("--reference", type=Path, help="a workdir holding an uninterrupted run of the same config")
    p.add_argument(
        "--target",
        type=Path,
        help="an already built tiny target to use instead of building one (its build takes minutes "
        "and starts over when killed, so kills landing there would test little else)",
    )
    args = p.parse_args()

    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    if args.target:
        cfg["target"]["path"], cfg["target"]["build_tiny"] = str(args.target.resolve()), None
    rng = random.Random(args.seed)
    kills = [rng.uniform(args.min_s, args.max_s) for _ in range(args.kills)]
    print(f"seed {args.seed}: kill moments (s into each round) {[round(k, 1) for k in kills]}", flush=True)

    if args.reference is None:
        args.reference = args.workdir / "reference"
        shutil.rmtree(args.reference, ignore_errors=True)
        args.reference.mkdir(parents=True)
        (args.reference / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        print(
            f"reference run: {run_to_end(args.reference, args.reference / 'config.yaml'):.0f} s", flush=True
        )
    chaos = args.workdir / "chaos"
    shutil.rmtree(chaos, ignore_errors=True)
    chaos.mkdir(parents=True)
    configfile = chaos / "config.yaml"
    configfile.write_text(yaml.safe_dump(cfg, sort_keys=False))
    run_dir = chaos / cfg["run_dir"]

    t0 = time.monotonic()
    rounds = chaos_run(chaos, configfile, run_dir, kills)
    killed = sum("servers_stopped" in r for r in rounds)
    final = run_to_end(chaos, configfile, "--rerun-incomplete")
    print(
        f"final round: {final:.0f} s; whole chaotic run {time.monotonic() - t0:.0f} s; kills survived: {killed}"
    )

    ours, theirs = digests(run_dir), digests(args.reference / cfg["run_dir"])
    same = [f for f in theirs if ours.get(f) == theirs[f]]
    differ = sorted(set(ours) ^ set(theirs) | {f for f in theirs if f in ours and ours[f] != theirs[f]})
    print(f"deterministic artifacts identical to the uninterrupted run: {len(same)} of {len(theirs)} files")
    for f in differ:
        print(f"  DIFFERS: {f}")
    a, b = acceptance(run_dir), acceptance(args.reference / cfg["run_dir"])
    for method in a:
        print(
            f"{method}: tokens per target step {a[method][0]} (uninterrupted {b[method][0]}), lossless {a[method][1]} ({b[method][1]})"
        )
    print(
        json.dumps(
            {
                "seed": args.seed,
                "rounds": rounds,
                "kills_survived": killed,
                "identical": len(same),
                "of": len(theirs),
                "differ": differ,
                "acceptance": a,
                "reference_acceptance": b,
            }
        )
    )


if __name__ == "__main__":
    main()
