# Config helpers shared by every rule file. Planning never loads a model, starts a server or
# touches the network: everything here reads the config and the local file system only.
import hashlib
import os
import re
from pathlib import Path

from snakemake.io import is_flagged
from snakemake.utils import validate

from eaglenest.data.benchmarks import benchmark_files, check_benchmarks
from eaglenest.data.modes import check_folder_switches, checked_modes
from eaglenest.data.prompts import check_prompt_sources, source_file
from eaglenest.engine.dtypes import choose_dtypes
from eaglenest.target.kimi_mini import ASSETS as KIMI_MINI_ASSETS
from eaglenest.draft.algorithms import check_draft_plan, is_parallel
from eaglenest.draft.config import check_sglang_target
from eaglenest.core.errors import EaglenestError
from eaglenest.planning.run_estimate import data_loaders, split_gpus
from eaglenest.pipeline.run_guard import claim_run_folder, forward_sigterm_to_jobs
from eaglenest.evaluation.methods import check_baselines, evaluated_methods
from eaglenest.target.gguf import gguf_source
from eaglenest.engine.server import WORKFLOW_PID_ENV, Lease
from eaglenest.training.sweep import base_settings, plan_variants, swept_keys, train_hp, train_settings
from eaglenest.target.resolve import (
    CONFIG_FILES_ENV,
    HUB_ID,
    cache_key_file,
    cached_commit,
    check_build_destination,
    check_remote_code_pinned,
    check_target,
    on_hub,
    repo_cache_folder,
)
from eaglenest.pipeline.code_hash import code_hash
from eaglenest.pipeline.workflow import vllm_base_args, vllm_env

# What the config was read from, for every message about it.
CONFIG_FILES = [str(f) for f in workflow.overwrite_configfiles] or ["config/config.yaml"]
try:
    validate(config, schema="../config/schemas/config.schema.yaml")
except WorkflowError as e:
    raise WorkflowError(f"config {', '.join(CONFIG_FILES)} does not match the schema", e)

# `auto` dtypes resolved for the machine that plans (eaglenest.engine.dtypes): bfloat16 only
# where it is computed natively, else float32; the resolved values are what every rule's params
# hold, and `eaglenest plan` states why.
DTYPES = choose_dtypes(config["vllm"]["dtype"], config["train"]["dtype"], config["vllm"]["device"])
config["vllm"]["dtype"], config["train"]["dtype"] = DTYPES["vllm"], DTYPES["train"]

RUN = config["run_dir"]
TARGET = config["target"]["path"]
BUILD_TINY = bool(config["target"]["build_tiny"])
# build_tiny's keys have no schema defaults (a default inside a null build_tiny crashes
# Snakemake's validator), so the builder's defaults are spelt out where they are read.
TINY_ARCHITECTURE = (config["target"]["build_tiny"] or {}).get("architecture", "llama")
# Editing the Kimi builder must not rebuild the tiny Llama (tiny_target imports it lazily).
TINY_BUILDERS_NOT_USED = () if TINY_ARCHITECTURE == "kimi_k25" else ("target.kimi_mini",)
# A hub id resolves through the hub cache (the configured one, else huggingface_hub's own).
TARGET_ON_HUB = on_hub(TARGET, TINY_ARCHITECTURE if BUILD_TINY else None)
# A target shipped as GGUF: import_gguf_target writes its HF folder at target.path.
GGUF = config["target"]["gguf"]
TARGET_CACHE = config["target"]["cache_dir"]
# Every stage that reads the target takes this record (folder, commit, files, shape) as input.
TARGET_RECORD = f"{RUN}/target.json"
GPUS = config["gpus"]
NUM_SHARDS = config["hidden_states"]["num_shards"]
# offline: extraction jobs store the shards before training; online and hybrid: train_draft
# reads hidden states from the run's server (eaglenest.hidden_states.online), so no shard is in the DAG.
HS_MODE = config["hidden_states"]["mode"]
SHARD_DIRS = [f"{RUN}/hidden_states/shard_{k}" for k in range(NUM_SHARDS)] if HS_MODE == "offline" else []
# The engines the draft is exported for: vLLM's folder always (evaluation serves it), SGLang's beside it.
SGLANG_EXPORT = "sglang" in config["export"]["engines"]
# A sweep's variants (eaglenest.training.sweep): the base, the run's own draft, first; [] without a sweep.
try:
    VARIANTS = plan_variants(config)
except EaglenestError as e:
    raise WorkflowError(f"config {e}")
SWEPT = swept_keys(config.get("sweep"))
# The variants that train their own draft under {RUN}/variants/{variant}/.
OWN_VARIANTS = {v.name: v for v in VARIANTS if not v.is_base}
VARIANT_DIR = f"{RUN}/variants/{{variant}}"
# Two or more data fractions: compare_variants fits acceptance against the training rows.
DATA_SCALING = len((config.get("sweep") or {}).get("data_fraction") or []) >= 2
# The files the tiny Llama rule and the GGUF import write; a production target is otherwise the
# user's folder or hub id.
TARGET_FILES = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]

if BUILD_TINY and GGUF:
    raise WorkflowError(
        f"config {', '.join(CONFIG_FILES)}: target.build_tiny and target.gguf both build "
        "target.path: keep one"
    )
# Public prompt sets evaluated beside the held-out split; their files are inputs.
BENCHMARKS = config["evaluate"]["benchmarks"]
try:
    GGUF_SOURCE = str(gguf_source(GGUF)) if GGUF else None
    check_benchmarks(BENCHMARKS)
    check_baselines(config["evaluate"]["baselines"])
    # No speculation, the model-free baselines, the untrained floor and the trained draft.
    EVAL_METHODS = evaluated_methods(config["evaluate"]["baselines"])
    BENCHMARK_FILES = sorted({str(f) for b in BENCHMARKS for f in benchmark_files(b)})
except EaglenestError as e:
    raise WorkflowError(f"config {', '.join(CONFIG_FILES)}: {e}")
try:
    check_target(TARGET, BUILD_TINY or bool(GGUF))
    # Before Snakemake deletes a builder's old outputs: never a user's files.
    if BUILD_TINY:
        check_build_destination(TARGET, TINY_ARCHITECTURE, TARGET_CACHE)
    elif GGUF:
        check_build_destination(TARGET, "gguf")
except EaglenestError as e:
    raise WorkflowError(f"config {', '.join(CONFIG_FILES)}: target.path: {e}")
# A run that exports to SGLang, checked before any stage where the target's config is here (a
# local folder); built and hub targets are checked by draft_config, before extraction.
if SGLANG_EXPORT and not (BUILD_TINY or GGUF or TARGET_ON_HUB):
    try:
        check_sglang_target(TARGET, config["hidden_states"]["aux_layer_ids"])
    except EaglenestError as e:
        raise WorkflowError(f"config {', '.join(CONFIG_FILES)}: export.engines: {e}")
# The drafters the run trains (its own and its sweep's), refused here when they cannot be
# evaluated or exported as configured (eaglenest.draft.algorithms).
try:
    check_draft_plan(config, [base_settings(config), *[v.settings for v in VARIANTS]])
except EaglenestError as e:
    raise WorkflowError(f"config {', '.join(CONFIG_FILES)}: {e}")
if HS_MODE != "offline" and config["vllm"]["device"] != "cpu":
    try:
        SERVER_GPUS, _ = split_gpus(GPUS, config["hidden_states"]["server_gpus"])
    except EaglenestError as e:
        raise WorkflowError(f"config: {e}")
    if config["vllm"]["tensor_parallel_size"] > SERVER_GPUS:
        raise WorkflowError(
            f"config: vllm.tensor_parallel_size {config['vllm']['tensor_parallel_size']} exceeds the "
            f"{SERVER_GPUS} GPUs the extraction server gets in {HS_MODE} mode (hidden_states.server_gpus)"
        )
if TARGET_ON_HUB and not HUB_ID.match(TARGET):
    raise WorkflowError(
        f"config target.path: {TARGET}: the kimi_k25 miniature is published "
        "into the hub cache, so its path must be a hub id 'org/name'"
    )
# Jobs name the config files in their messages (a remote-code target to pin).
os.environ[CONFIG_FILES_ENV] = ", ".join(CONFIG_FILES)
# Remote code from a branch: refused here where the cache already names its commit; otherwise
# download_target refuses once the hub names it, before fetching (eaglenest.target.resolve).
if TARGET_ON_HUB and not BUILD_TINY and config["target"]["trust_remote_code"]:
    try:
        _cached = cached_commit(TARGET, config["target"]["revision"], TARGET_CACHE)
        if _cached:
            check_remote_code_pinned(
                TARGET,
                config["target"]["revision"],
                _cached,
                allow_unpinned=config["target"]["allow_unpinned_remote_code"],
            )
    except EaglenestError as e:  # the message names the config files itself
        raise WorkflowError(str(e))

# A mode's template switch that the target's template never reads: refused here wherever the
# template is on disk already (the miniature's own, a local folder, a cached hub revision);
# regenerate_responses checks again before its server starts.
try:
    _template_folder = None
    if BUILD_TINY and TINY_ARCHITECTURE == "kimi_k25":
        _template_folder = KIMI_MINI_ASSETS
    elif not BUILD_TINY and not GGUF and not TARGET_ON_HUB:
        _template_folder = TARGET
    elif TARGET_ON_HUB and not BUILD_TINY:
        _cached = cached_commit(TARGET, config["target"]["revision"], TARGET_CACHE)
        if _cached:
            _template_folder = repo_cache_folder(TARGET, TARGET_CACHE) / "snapshots" / _cached
    if _template_folder is not None:
        check_folder_switches(config["modes"], _template_folder, f"{TARGET} ({_template_folder})")
    checked_modes(config["modes"])
except EaglenestError as e:
    raise WorkflowError(f"config {', '.join(CONFIG_FILES)}: modes: {e}")

# Prompt sources, from the local files alone: each file found (a package's included), and a
# source asked for its own answers (responses: dataset) refused when its first records have none.
try:
    check_prompt_sources(config["prompts"]["sources"])
except EaglenestError as e:
    raise WorkflowError(f"config {', '.join(CONFIG_FILES)}: {e}")

# GPU jobs find the leased vLLM server through this; its supervisor stops the server when
# this process is gone, however the workflow ends.
os.environ.setdefault(WORKFLOW_PID_ENV, str(os.getpid()))


def target_source_files():
    """The files whose change means a new target, as resolve_target's input.

    A hub id: the cache file that changes when a new revision lands (refs/BRANCH, or the pinned
    commit's config.json), made by build_tiny_target or download_target when missing. A local
    folder: its files. Planning reads the local file system only, never the network.
    """
    if TARGET_ON_HUB:
        return [str(cache_key_file(TARGET, config["target"]["revision"], TARGET_CACHE))]
    if BUILD_TINY or GGUF:
        return [f"{TARGET}/{name}" for name in TARGET_FILES]
    return sorted(str(f) for f in Path(TARGET).rglob("*") if f.is_file())


def repository_file(path):
    """A file the repository ships, as an input: relative to the working directory when the
    workflow runs from its own checkout, so another clone (or a moved one) with the same run
    folder plans the same inputs; absolute when the working directory is elsewhere (-d). Marked
    ancient: a clone's checkout gives the file a new time, not new content; its content is a
    param of the rule that reads it (repository_digests), so an edit still reruns it."""
    path = Path(workflow.basedir).resolve() / path
    try:
        return ancient(str(path.relative_to(Path.cwd().resolve())))
    except ValueError:
        return ancient(str(path))


def repository_digests(files) -> dict:
    """sha256 of each repository file among `files` (the ones repository_file marked)."""
    return {
        str(f): hashlib.sha256(Path(f).read_bytes()).hexdigest()
        for f in files
        if is_flagged(f, "ancient") and Path(f).exists()
    }


def tiny_target_corpus():
    """The texts the tiny target learns from (relative paths: from the repository). Its own
    corpus, not the prompts: the prompts it later answers are new to it, as users' are to a
    real model."""
    # No schema default for corpus: see TINY_ARCHITECTURE.
    path = Path(config["target"]["build_tiny"].get("corpus", "data/tiny_target/corpus.jsonl"))
    return str(path) if path.is_absolute() else repository_file(path)


def tiny_target_tool_corpus():
    """The tool-calling conversations the Kimi miniature learns its call markup from (none by
    default)."""
    path = config["target"]["build_tiny"].get("tool_corpus")
    if not path:
        return []
    return [str(path) if Path(path).is_absolute() else repository_file(Path(path))]


def prompt_source_files():
    """Local prompt files are inputs, so editing them reruns the data stages."""
    files = []
    # A source's path has no schema default (it applies to some types only), hence the .get.
    for src in config["prompts"]["sources"]:
        if src["type"] == "bundled":
            files.append(repository_file(Path("data", "prompts", src.get("path", "default.jsonl"))))
        elif src["type"] in ("jsonl", "parquet"):
            files.append(src["path"])
        elif src["type"] == "sharegpt":  # a local file, or one an installed package ships
            files.append(str(source_file(src)))
    return files


def server_params():
    """Everything that defines the run's vLLM servers, as one params value."""
    return {
        "base_args": list(vllm_base_args(config["vllm"], config["target"])),
        "env": dict(vllm_env(config["vllm"])),
        "device": config["vllm"]["device"],
        "reuse": config["vllm"]["reuse_server"],
        "startup_timeout_s": config["vllm"]["startup_timeout_s"],
        "stall_timeout_s": config["vllm"]["stall_timeout_s"],
    }


def train_code():
    """Code hash of train_draft: offline, without the online extraction's modules; online and
    hybrid with them and the CPU KV connector their server loads by name."""
    if HS_MODE == "offline":
        return code_hash("train_draft", leave_out=("hidden_states.online",))
    return code_hash("train_draft", also=("engine.cpu_connector",))


def start_run():
    """The main process, before the first job: one workflow per run folder, and SIGTERM
    reaches the running jobs (eaglenest.pipeline.run_guard)."""
    try:
        claim_run_folder(RUN)
    except EaglenestError as e:
        raise WorkflowError(str(e))
    forward_sigterm_to_jobs()


def release_server():
    Lease(RUN).release()


def variant_setting(key):
    """A params function: the variant's value of a sweepable setting."""
    return lambda wildcards: OWN_VARIANTS[wildcards.variant].settings[key]


def mask_token_counts(wildcards):
    """tokenize's token counts for a parallel draft (the run's or a variant's), whose mask token
    must be one the target never writes (eaglenest.draft.mask_token); none for EAGLE-3, whose
    draft config is so written, and its SGLang layers checked, before extraction."""
    variant = getattr(wildcards, "variant", None)
    algorithm = OWN_VARIANTS[variant].settings["algorithm"] if variant else config["draft"]["algorithm"]
    # One path or nothing: the script reads input.token_freq as a path, or as empty.
    return rules.tokenize.output.freq if is_parallel(algorithm) else []


def variant_hp(wildcards):
    return train_hp(config, OWN_VARIANTS[wildcards.variant].settings)


def variant_outputs(own_output, base_output):
    """A file of every variant, in the sweep's order: the base's is the run's own."""
    return [base_output if v.is_base else expand(own_output, variant=v.name)[0] for v in VARIANTS]


def run_benchmark_files(shards=True):
    """What Snakemake's `benchmark:` records for each job of the run, in stage order; without
    `shards`, less the extraction jobs' files. As inputs those are a thousand more files for
    Snakemake to find a producer of at every plan of a 1,000-shard run (a sixth of its work)."""
    return [
        *([rules.import_gguf_target.benchmark] if GGUF else []),
        rules.resolve_target.benchmark,
        rules.prepare_prompts.benchmark,
        rules.regenerate_responses.benchmark,
        rules.tokenize.benchmark,
        rules.draft_config.benchmark,
        rules.build_vocab_mapping.benchmark,
        rules.plan_hidden_states.benchmark,
        *(expand(rules.extract_hidden_states.benchmark, k=range(len(SHARD_DIRS))) if shards else []),
        rules.train_draft.benchmark,
        rules.export_draft.benchmark,
        *([f"{RUN}/benchmarks/export_draft_sglang.tsv"] if SGLANG_EXPORT else []),
        rules.prepare_benchmarks.benchmark,
        rules.evaluate_acceptance.benchmark,
    ]
