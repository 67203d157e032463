"""Shared fixtures: run the real workflow in a scratch folder, offline."""

from __future__ import annotations

import atexit
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from eaglenest.pipeline.job_events import read_events

os.environ["HF_HUB_OFFLINE"] = "1"
# Remote code that transformers imports (the Kimi miniature's tokenizer) is copied into
# HF_MODULES_CACHE, read once when transformers is first imported: point it at a scratch folder
# before any test imports transformers, so the suite leaves nothing in ~/.cache.
_MODULES = tempfile.mkdtemp(prefix="eaglenest-test-hf-modules-")
os.environ["HF_MODULES_CACHE"] = _MODULES
atexit.register(shutil.rmtree, _MODULES, ignore_errors=True)

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
# Every dry run of the suite runs Snakemake with torch unimportable: planning parses the workflow
# on every call (the suite makes dozens, a user's `-n` too) and torch would add a second or more
# to each, so a module that pulled it into planning fails the first dry run that reaches it.
SNAKEMAKE_WITHOUT_TORCH = [
    sys.executable,
    "-c",
    "import sys; sys.modules['torch'] = None; sys.argv[0] = 'snakemake'\n"
    "from snakemake.cli import main\n"
    "main()",
]
_INVOCATIONS = itertools.count()
GPU_RULES = {"regenerate_responses", "extract_hidden_states", "train_draft", "evaluate_acceptance"}


def target_record(folder: Path, record: Path, trust_remote_code: bool = False) -> Path:
    """What the resolve_target rule writes for a local model folder, as adapter tests need it."""
    from eaglenest.target.resolve import resolve_stage

    resolve_stage(
        name=str(folder),
        revision=None,
        cache_dir=None,
        trust_remote_code=trust_remote_code,
        out_record=record,
    )
    return record


@pytest.fixture(scope="session")
def untrained_target(tmp_path_factory) -> Path:
    """The tiny Llama's files (tokenizer, chat template, config, servable weights) without its
    training steps: for tests where the weights do not matter. Built once per suite."""
    from eaglenest.target.tiny import build_tiny_target

    corpus = [REPO / "data" / "tiny_target" / "corpus.jsonl"]
    return build_tiny_target(tmp_path_factory.mktemp("untrained") / "target", corpus, pretrain_steps=0)


def assert_shard_matches_transformers(
    shard_dir: Path, run_dir: Path, target, shard: int, num_shards: int, dtype: str, scratch: Path
) -> None:
    """A written shard against the transformers backend's files for the same rows (extracted
    into `scratch` in this process): the same files, token ids exactly, hidden states to bf16
    tolerance (vLLM and transformers sum in different orders)."""
    # Imported here: torch and the extractor are for the engine tests that call this, not for
    # every unit test's collection.
    import torch
    from safetensors.torch import load_file

    from eaglenest.hidden_states.extract import extract_shard_transformers

    plan = json.loads((run_dir / "hidden_states" / "plan.json").read_text())
    extract_shard_transformers(
        str(target),
        run_dir / "tokenized" / "tokenized_data.jsonl",
        scratch,
        num_rows=plan["samples"],
        shard=shard,
        num_shards=num_shards,
        aux_layer_ids=plan["aux_layer_ids"],
        dtype=dtype,
        meta={},
    )
    files = sorted(p.name for p in shard_dir.glob("hs_*.safetensors"))
    assert files and files == sorted(p.name for p in scratch.glob("hs_*.safetensors")), shard_dir
    for file in files:
        ours, theirs = load_file(str(shard_dir / file)), load_file(str(scratch / file))
        assert torch.equal(ours["token_ids"], theirs["token_ids"]), shard_dir / file
        # Same layers, same slot order (the last is the input of the final norm).
        torch.testing.assert_close(
            ours["hidden_states"].float(), theirs["hidden_states"].float(), atol=2e-2, rtol=2e-2
        )


def fresh_clone(dest: Path) -> Path:
    """What a fresh clone of this checkout holds (its tracked files and new ones git does not
    ignore, as they are in the working tree), at `dest`: a repository root to type the README's
    commands in, with nothing of this checkout's own runs."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        src = REPO / name
        if src.is_file():  # a tracked file deleted in the working tree is not in a clone of it
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def folder_bytes(folder: Path) -> dict:
    """Every file below `folder` and its bytes: to show a folder was left untouched."""
    return {str(f.relative_to(folder)): f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}


def users_model(built: Path, dest: Path) -> Path:
    """A copy of a built model folder without the builder's marker: a model of the user's own."""
    from eaglenest.target.resolve import BUILD_MARKER

    shutil.copytree(built, dest)
    (dest / BUILD_MARKER).unlink()
    return dest


def default_config() -> dict:
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def trainer_inputs() -> dict:
    """trainer_args' paths and shape for a run that is never started (the flags alone)."""
    return dict(
        target="/models/k",
        data_dir="d",
        save_path="s",
        draft_config="c.json",
        d2t_npy="d2t.npy",
        t2d_npy="t2d.npy",
        draft_vocab_size=32,
        aux_layer_ids=[2, 4, 5],
        log_dir="l",
    )


def write_config(workdir: Path, cfg: dict, name: str = "config.yaml") -> Path:
    path = workdir / name
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def snakemake_command(
    workdir: Path, configfile: Path | None, *args: str
) -> tuple[list[str], Path | None, Path]:
    """The command line that runs the workflow with `workdir` as working directory, the folder
    to start it in, and its job-events file: typed from a checkout's own root (as a user does)
    when `workdir` is one (`fresh_clone`), else the repository's Snakefile with `-d`. The GPU cap
    and the job-events logger come from profiles/default, as in `make run` (a plain
    `snakemake --cores all`), not from here; only the events file's name is set."""
    events = workdir / ".snakemake" / "test-events" / f"{next(_INVOCATIONS):03d}.jobs.jsonl"
    checkout = (workdir / "Snakefile").is_file()
    if checkout and configfile is not None and configfile.is_relative_to(workdir):
        configfile = configfile.relative_to(workdir)  # typed from the checkout's root: config/NAME.yaml
    cmd = [
        *(SNAKEMAKE_WITHOUT_TORCH if "-n" in args else SNAKEMAKE),
        "-s",
        str((workdir if checkout else REPO) / "Snakefile"),
        "-d",
        str(workdir),
        # None: no --configfile, so the Snakefile's embedded default.
        *([] if configfile is None else ["--configfile", str(configfile)]),
        "--logger-eaglenest-jobs-path",
        str(events),
        *args,
    ]
    return cmd, (workdir if checkout else None), events


def run_env(env: dict | None) -> dict:
    return {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}


def snakemake(
    workdir: Path,
    configfile: Path | None,
    *args: str,
    timeout: int = 3000,
    check: bool = True,
    env: dict | None = None,
) -> subprocess.CompletedProcess:
    """Run the workflow (`snakemake_command`) to its end; the events file is `proc.events`
    (absent when no job was announced: nothing to do)."""
    cmd, cwd, events = snakemake_command(workdir, configfile, *args)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=run_env(env))
    if check and proc.returncode != 0:
        raise AssertionError(
            f"snakemake failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
        )
    proc.events = events
    return proc


class BackgroundRun:
    """A workflow run started now and waited for later, its output in `workdir/run.log`. Stopped
    at exit if still going (SIGTERM to its PID, which the workflow forwards to its jobs and
    servers), as when the session stops at a first failure."""

    def __init__(self, workdir: Path, configfile: Path | None, *args: str, env: dict | None = None):
        cmd, cwd, self.events = snakemake_command(workdir, configfile, *args)
        self.log = workdir / "run.log"
        with open(self.log, "w") as out:
            self._proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=run_env(env)
            )
        atexit.register(self.stop)

    def wait(self, timeout: int = 3600) -> str:
        """The run's whole output, once it has ended well."""
        code = self._proc.wait(timeout=timeout)
        text = self.log.read_text()
        if code != 0:
            raise AssertionError(f"snakemake failed ({code}):\n{text[-8000:]}")
        return text

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            self._proc.wait(timeout=120)


def planned_jobs(proc: subprocess.CompletedProcess) -> dict[str, int]:
    """The jobs of a dry run by rule, `all` included: rule -> count (empty when nothing is to
    be done), from its job events."""
    if not proc.events.exists():
        return {}
    rules = [j.rule for j in read_events(proc.events).jobs]
    return {r: rules.count(r) for r in sorted(set(rules))}


def job_timeline(events: Path) -> list[dict]:
    """Start and end (None unless it finished) of every job a run started, by jobid: dicts
    with jobid, rule, start, end (seconds since the epoch)."""
    started = [j for j in read_events(events).jobs if j.start is not None]
    return [
        {"jobid": j.jobid, "rule": j.rule, "start": j.start, "end": j.end if j.status == "finished" else None}
        for j in sorted(started, key=lambda j: j.jobid)
    ]


# The suite's default run is config/config.yaml on fewer prompts and epochs: the assertions on it
# keep their margins there (the trained draft's tokens per target step against the untrained
# one's, the training curves), and CI gains minutes. The unchanged config, and the README's
# figures for it, are benchmarks/bench_default_run.py's.
DEFAULT_RUN_CUT = {"prompts": 600, "epochs": 4}  # and both exports (export.engines)


def start_default_run(tmp_path_factory) -> dict:
    """The default pipeline on DEFAULT_RUN_CUT's share of the default config's prompts and epochs."""
    workdir = tmp_path_factory.mktemp("default_run")
    cfg = default_config()
    (source,) = cfg["prompts"]["sources"]
    source["samples"] = DEFAULT_RUN_CUT["prompts"]
    cfg["train"]["epochs"] = DEFAULT_RUN_CUT["epochs"]
    # Both exports, so the pipeline tests see SGLang's beside the vLLM one the evaluation serves.
    cfg["export"]["engines"] = ["vllm", "sglang"]
    configfile = write_config(workdir, cfg)
    return {
        "workdir": workdir,
        "config": cfg,
        "configfile": configfile,
        "run_dir": workdir / cfg["run_dir"],
        "run": BackgroundRun(workdir, configfile, "--cores", "2"),
    }


def start_kimi_mini_run(tmp_path_factory) -> dict:
    """The seed case's miniature as the README types it from a fresh clone's root
    (`snakemake --cores all --configfile config/kimi-mini.yaml`, the shipped file as it is).
    HF_HOME points into the scratch folder, so a run that wrote to the user's cache would show
    there."""
    workdir = fresh_clone(tmp_path_factory.mktemp("kimi_mini_run"))
    configfile = workdir / "config" / "kimi-mini.yaml"
    cfg = yaml.safe_load(configfile.read_text())
    env = {"HF_HOME": str(workdir / "hf-home"), "HF_HUB_OFFLINE": "1"}
    return {
        "workdir": workdir,
        "config": cfg,
        "configfile": configfile,
        "env": env,
        "run_dir": workdir / cfg["run_dir"],
        "cache": workdir / cfg["target"]["cache_dir"],
        "run": BackgroundRun(workdir, configfile, "--cores", "2", env=env),
    }


SHARED_RUNS = {"default_run": start_default_run, "kimi_mini_run": start_kimi_mini_run}
_STARTED: dict[str, dict] = {}


def start_shared_runs(request) -> None:
    """Start every shared run that a selected test reads and that has not started yet."""
    for name, start in SHARED_RUNS.items():
        if name not in _STARTED and any(name in item.fixturenames for item in request.session.items):
            _STARTED[name] = start(request.getfixturevalue("tmp_path_factory"))


def pytest_collection_modifyitems(items):
    """Tests that read no shared run first, then those reading the Kimi miniature's run (the
    shorter one alone), then those reading the default run: while the shared runs build in the
    background the session works through tests that need neither, instead of waiting for one.
    Stable, so each module's tests keep their order."""
    ready_order = ("kimi_mini_run", "default_run")

    def group(item) -> int:
        return max((k + 1 for k, name in enumerate(ready_order) if name in item.fixturenames), default=0)

    items.sort(key=group)


@pytest.fixture(scope="session", autouse=True)
def shared_runs_started(request):
    """The shared runs start with the session's first test, side by side and beside the tests
    that do not read them: on 2 cores a run's single-threaded stretches (server starts, imports,
    the engine's one bound core) leave room, and CI gains minutes. A session that selects no
    test reading them starts none."""
    start_shared_runs(request)


def shared_run(request, name: str) -> dict:
    """The session's run `name`, ended."""
    start_shared_runs(request)
    info = dict(_STARTED[name])
    run = info.pop("run")
    info["log"] = run.wait()
    info["events"] = run.events
    return info


@pytest.fixture(scope="session")
def default_run(request):
    """The default pipeline, run once for the whole session (real vLLM and speculators), on
    DEFAULT_RUN_CUT's share of the default config's prompts and epochs."""
    return shared_run(request, "default_run")


@pytest.fixture(scope="session")
def kimi_mini_run(request):
    """The seed case's miniature, run once as the README types it from a fresh clone's root: a
    Kimi-K2.5-shaped target built, published into a hub cache and resolved by its hub id, with a
    remote-code tokenizer and a thinking template."""
    return shared_run(request, "kimi_mini_run")
