"""The seed case's miniature end to end: a Kimi-K2.5-shaped target named by a hub id.

One session-scoped run (tests/conftest.py: `kimi_mini_run`, config/kimi-mini.yaml) feeds every
test here: the target is a `KimiK25ForConditionalGeneration` (DeepSeek-V3 text model with MLA
and MoE, a vision tower, a nested text_config) with a tiktoken tokenizer shipped as remote code
and a thinking chat template, published into a hub cache and resolved by its hub id.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import planned_jobs, snakemake, write_config

pytestmark = pytest.mark.engine

HUB_ID = "eaglenest-test/kimi-mini"


def read_jsonl(path):
    return [json.loads(line) for line in open(path)]


def test_the_trained_draft_beats_the_untrained_one_and_ngram_losslessly(kimi_mini_run):
    acc = json.loads((kimi_mini_run["run_dir"] / "eval" / "acceptance.json").read_text())
    draft, untrained, ngram = acc["draft"], acc["untrained_draft"], acc["ngram"]
    assert draft["drafting_steps"] > 0
    assert draft["mean_acceptance_length"] > 1.2 * untrained["mean_acceptance_length"]
    assert draft["mean_acceptance_length"] > ngram["mean_acceptance_length"]
    for method in ("ngram", "suffix", "untrained_draft", "draft"):
        assert acc[method]["lossless"] and acc[method]["identical_fraction"] == 1.0, method


def test_the_seed_cases_sglang_export_keeps_deepseeks_layer_ids_and_its_yarn(kimi_mini_run):
    """config/kimi-mini.yaml exports to SGLang as the seed case's config does: SGLang's
    DeepSeek-V3 language model (which Kimi-K2.5's class hands the call to) captures the ids as
    they are, and its YaRN rope is the one speculators trained with (the parity check rotates
    it as SGLang does)."""
    run = kimi_mini_run["run_dir"]
    vllm_cfg = json.loads((run / "draft" / "config.json").read_text())
    cfg = json.loads((run / "draft_sglang" / "config.json").read_text())
    record = json.loads((run / "draft_sglang" / "eaglenest_export.json").read_text())
    assert cfg["eaglenest"]["target_architecture"] == "KimiK25ForConditionalGeneration"
    assert (
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        == vllm_cfg["eagle_aux_hidden_state_layer_ids"]
    )
    assert cfg["rope_parameters"]["rope_type"] == "yarn" and cfg["rope_scaling"] == cfg["rope_parameters"]
    assert record["checks"]["parity"]["ok"] is True, record["checks"]
    assert all(check["ok"] for check in record["checks"].values()), record["checks"]


def test_the_hub_id_resolves_from_the_cache_for_every_stage(kimi_mini_run):
    run, cache = kimi_mini_run["run_dir"], kimi_mini_run["cache"]
    record = json.loads((run / "target.json").read_text())
    commit = (cache / "models--eaglenest-test--kimi-mini" / "refs" / "main").read_text()
    assert record["source"] == "hub" and record["name"] == HUB_ID
    assert record["commit"] == commit
    assert (
        Path(record["path"]) == (cache / "models--eaglenest-test--kimi-mini" / "snapshots" / commit).resolve()
    )
    # The text model's sizes, not the multimodal wrapper's.
    assert record["shape"]["multimodal"]
    assert record["shape"]["architectures"] == ["KimiK25ForConditionalGeneration"]
    meta = json.loads((run / "tokenized" / "metadata.json").read_text())
    coverage = json.loads((run / "vocab" / "vocab_coverage.json").read_text())
    draft = json.loads((run / "draft_config.json").read_text())
    vocab = record["shape"]["vocab_size"]
    assert meta["target_vocab_size"] == coverage["target_vocab_size"] == draft["vocab_size"] == vocab
    assert meta["target_revision"] == commit
    # Its remote code is the repository's own, built here, and recorded with its hash.
    assert [f["file"] for f in record["remote_code"]] == ["tokenization_kimi_mini.py"]
    # Every engine loaded the snapshot: the servers and the trainer were given its folder.
    server_logs = list((run / ".eaglenest" / "server").glob("server-*.log"))
    commands = [line for log in server_logs for line in open(log) if line.startswith("$ ")]
    assert commands and all(f"--model {record['path']}" in c for c in commands)
    assert all("--trust-remote-code" in c for c in commands)
    train_log = (run / "logs" / "train_draft.log").read_text()
    assert f"--verifier-name-or-path {record['path']}" in train_log
    assert "--trust-remote-code" in train_log and "--mask-token-id" in train_log
    exported = json.loads((run / "draft" / "config.json").read_text())
    assert exported["speculators_config"]["verifier"]["name_or_path"] == HUB_ID
    # Nothing went to the user's hub cache (HF_HOME of the run): the configured cache only.
    assert not list((Path(kimi_mini_run["env"]["HF_HOME"]) / "hub").glob("models--*"))


def test_its_remote_code_runs_only_from_a_pinned_commit(kimi_mini_run):
    """The miniature's published cache, taken as a downloaded model (no build_tiny): with
    target.revision null the workflow refuses to plan, naming the config file, the key and the
    commit to pin; pinned, resolve_target runs and records the tokenizer's code and its hash."""
    from eaglenest.target.kimi_mini import ASSETS

    work, cache = kimi_mini_run["workdir"], kimi_mini_run["cache"]
    commit = (cache / "models--eaglenest-test--kimi-mini" / "refs" / "main").read_text()
    cfg = {**kimi_mini_run["config"], "run_dir": "results/kimi-downloaded"}
    cfg["target"] = {**cfg["target"], "build_tiny": None, "cache_dir": str(cache)}
    configfile = write_config(work, cfg, "kimi-downloaded.yaml")
    proc = snakemake(work, configfile, "-n", check=False, env=kimi_mini_run["env"])
    assert proc.returncode != 0
    assert f"set target.revision: {commit} in {configfile}" in proc.stdout + proc.stderr
    assert not (work / "results" / "kimi-downloaded").exists()
    configfile = write_config(
        work, {**cfg, "target": {**cfg["target"], "revision": commit}}, "kimi-downloaded.yaml"
    )
    snakemake(
        work, configfile, "results/kimi-downloaded/target.json", "--cores", "1", env=kimi_mini_run["env"]
    )
    record = json.loads((work / "results" / "kimi-downloaded" / "target.json").read_text())
    code = ASSETS / "tokenization_kimi_mini.py"
    assert record["commit"] == commit
    assert [(f["file"], f["sha256"]) for f in record["remote_code"]] == [
        (code.name, hashlib.sha256(code.read_bytes()).hexdigest())
    ]


def _as_served(messages: list[dict]) -> list[dict]:
    """Messages as vLLM's server hands them to the template: tool-call arguments as objects."""
    return [
        {**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                             for c in m["tool_calls"]]} if m.get("tool_calls") else m
        for m in messages
    ]  # fmt: skip


def test_tokenize_and_vllm_use_the_same_remote_code_tokenizer(kimi_mini_run):
    """Every prompt vLLM rendered, the first and each round of a tool loop, in either mode, is
    the template's render of the recorded conversation through the remote-code tokenizer: the
    reasoning sent back under `reasoning` reached the template, the calls as the engine parsed
    them, the mode's switch at the top level of the request."""
    from eaglenest.target.resolve import load_target, load_tokenizer

    run = kimi_mini_run["run_dir"]
    target = load_target(run / "target.json")
    assert sorted(Path(target.path).glob("tokenization_*.py"))
    assert not (Path(target.path) / "tokenizer.json").exists()
    tok = load_tokenizer(target.path, trust_remote_code=True)
    assert not tok.is_fast  # the remote-code tiktoken class, not a converted fast tokenizer
    rows = [r for r in read_jsonl(run / "responses" / "raw_responses.jsonl") if "error" not in r]
    assert rows
    for row in rows:
        for generation in row["generations"]:
            history = _as_served(row["messages"][: generation["messages_before"]])
            text = tok.apply_chat_template(
                history,
                tools=row.get("tools"),
                tokenize=False,
                add_generation_prompt=True,
                **row.get("chat_template_kwargs", {}),
            )
            assert tok(text, add_special_tokens=False)["input_ids"] == generation["prompt_token_ids"], row[
                "id"
            ]
    meta = json.loads((run / "tokenized" / "metadata.json").read_text())
    assert meta["mask_method"]["served_token_ids"] == meta["samples_out"]


def test_regeneration_captured_the_reasoning(kimi_mini_run):
    from eaglenest.target.resolve import load_target, load_tokenizer

    run = kimi_mini_run["run_dir"]
    rows = [r for r in read_jsonl(run / "responses" / "raw_responses.jsonl") if "error" not in r]
    thinking = [r for r in rows if r["mode"] == "thinking" and "tools" not in r]
    with_reasoning = [r for r in thinking if (r["messages"][-1].get("reasoning_content") or "").strip()]
    assert len(with_reasoning) >= 0.3 * len(thinking)
    # The draft trains on what the target emitted: its reasoning tokens are loss-masked.
    tok = load_tokenizer(load_target(run / "target.json").path, trust_remote_code=True)
    think_end = tok.convert_tokens_to_ids("</think>")
    data = read_jsonl(run / "tokenized" / "tokenized_data.jsonl")
    masked_think_ends = sum(
        1 for r in data for t, m in zip(r["input_ids"], r["loss_mask"]) if t == think_end and m
    )
    assert masked_think_ends >= 0.5 * len(thinking)
    meta = json.loads((run / "tokenized" / "metadata.json").read_text())
    assert meta["supervised_tokens"]["by_mode"]["thinking"]["reasoning"] > 0


def test_tool_loops_ran_through_vllms_kimi_parsers_in_both_modes(kimi_mini_run):
    """The miniature answers its tools rows in Kimi's native call markup; vLLM's kimi_k2 parser
    returns the calls, the loop sends the recorded results back and the target answers again;
    instant rows carry their switch; the call markup is supervised and has draft slots."""
    from eaglenest.target.resolve import load_target, load_tokenizer

    run = kimi_mini_run["run_dir"]
    rows = [r for r in read_jsonl(run / "responses" / "raw_responses.jsonl") if "error" not in r]
    tools = [r for r in rows if "tools" in r]
    assert tools and {r["mode"] for r in tools} == {"thinking", "instant"}
    tok = load_tokenizer(load_target(run / "target.json").path, trust_remote_code=True)
    section = tok.convert_tokens_to_ids("<|tool_calls_section_begin|>")
    calling = [r for r in tools if section in r["generations"][0]["completion_token_ids"]]
    assert len(calling) >= 0.5 * len(tools)
    for row in calling:  # parsed by the engine: native ids, the name after them
        call = row["messages"][row["generations"][0]["messages_before"]]
        assert call["tool_calls"][0]["id"].startswith(
            f"functions.{call['tool_calls'][0]['function']['name']}:"
        )
    looped = [r for r in tools if len(r["generations"]) >= 2]
    assert looped, "no tool loop went past its first call"
    for row in looped:
        second = row["messages"][row["generations"][1]["messages_before"] - 1]
        assert second["role"] == "tool"
    for row in rows:
        assert row.get("chat_template_kwargs") == ({"thinking": False} if row["mode"] == "instant" else None)
    meta = json.loads((run / "tokenized" / "metadata.json").read_text())
    assert meta["records"]["by_class"]["tool"] == len(tools)
    assert meta["generations"] == sum(len(r["generations"]) for r in rows)
    assert sum(meta["tool_loops_cut"].values()) == sum(r["cut"] is not None for r in rows)
    for mode in ("thinking", "instant"):
        assert meta["supervised_tokens"]["by_mode"][mode]["tool_call"] > 0, mode
    forced = json.loads((run / "vocab" / "vocab_coverage.json").read_text())["forced_special_tokens"]
    assert {"<|tool_calls_section_begin|>", "<|tool_call_end|>", "<|im_end|>"} <= set(forced.values())
    # Every held-out prompt asked in both modes, each with its switch; the held-out tool rows
    # replayed as loops, round by round (a class of their own).
    import pandas as pd

    acc = json.loads((run / "eval" / "acceptance.json").read_text())
    table = pd.read_csv(run / "eval" / "benchmarks.csv")
    whole = (table["category"] == "all") & (table["span"] == "all")
    held = table[
        whole & (table["set"] == "held_out") & (table["method"] == "draft") & (table["traffic"] == "all")
    ]
    by_mode = held[held["mode"] != "all"].set_index("mode")["requests"]
    assert set(by_mode.index) == {"thinking", "instant"}
    assert by_mode.sum() == held[held["mode"] == "all"]["requests"].item()
    loops = table[
        whole & (table["set"] == "held_out") & (table["mode"] == "all") & (table["traffic"] == "tool_loop")
    ]
    prompts_with_results = [
        r for r in read_jsonl(run / "prompts" / "eval_prompts.jsonl") if r.get("tool_results")
    ]
    assert prompts_with_results and (loops["requests"] > 2 * len(prompts_with_results)).all()
    outputs = read_jsonl(run / "eval" / "outputs.jsonl")
    assert {o["mode"] for o in outputs} == {"thinking", "instant"}
    assert any(o["turn"] > 0 and o["set"] == "held_out" for o in outputs)  # a loop went past its call
    # BFCL asked with its tools in both modes; the draft's spans placed, the markup among them.
    assert set(acc["benchmarks"]["bfcl"]["draft"]["per_mode"]) == {"thinking", "instant"}
    spans = acc["draft"]["per_span"]
    assert spans["requests_attributed"] > 0.8 * spans["requests"]
    assert {"reasoning", "answer", "tool_call"} <= set(spans["kinds"])
    assert acc["ngram"]["per_span"]["requests_attributed"] == 0  # its steps cannot be placed


def test_nothing_to_do_after_the_run(kimi_mini_run):
    proc = snakemake(kimi_mini_run["workdir"], kimi_mini_run["configfile"], "-n", env=kimi_mini_run["env"])
    assert planned_jobs(proc) == {}


def test_a_new_snapshot_revision_reruns_the_target_stages_and_nothing_upstream(kimi_mini_run):
    from eaglenest.target.resolve import publish_to_hub_cache

    work, cache = kimi_mini_run["workdir"], kimi_mini_run["cache"]
    ref = cache / "models--eaglenest-test--kimi-mini" / "refs" / "main"
    old_commit, old_stat = ref.read_text(), ref.stat()
    snapshot = ref.parent.parent / "snapshots" / old_commit
    changed = work / "new-revision"
    shutil.copytree(snapshot, changed, symlinks=False)
    gen = json.loads((changed / "generation_config.json").read_text())
    (changed / "generation_config.json").write_text(json.dumps({**gen, "revision_note": 2}))
    try:
        assert publish_to_hub_cache(changed, HUB_ID, cache) != old_commit
        proc = snakemake(work, kimi_mini_run["configfile"], "-n", env=kimi_mini_run["env"])
        jobs = planned_jobs(proc)
        assert {
            "resolve_target",
            "regenerate_responses",
            "tokenize",
            "build_vocab_mapping",
            "draft_config",
            "plan_hidden_states",
            "extract_hidden_states",
            "train_draft",
            "export_draft",
            "evaluate_acceptance",
        } <= set(jobs)
        assert "prepare_prompts" not in jobs and "build_tiny_target" not in jobs
    finally:
        ref.write_text(old_commit)
        os.utime(ref, ns=(old_stat.st_atime_ns, old_stat.st_mtime_ns))
    proc = snakemake(work, kimi_mini_run["configfile"], "-n", env=kimi_mini_run["env"])
    assert planned_jobs(proc) == {}


def test_plan_states_the_cache_status(kimi_mini_run, capsys, monkeypatch):
    from eaglenest import cli

    monkeypatch.chdir(kimi_mini_run["workdir"])
    commit = (kimi_mini_run["cache"] / "models--eaglenest-test--kimi-mini" / "refs" / "main").read_text()
    assert (
        cli.main(["plan", "--configfile", "config/kimi-mini.yaml"]) == 0  # as typed from the clone's root
    )
    out = capsys.readouterr().out
    assert "Nothing to run" in out
    cache = kimi_mini_run["workdir"] / kimi_mini_run["config"]["target"]["cache_dir"]
    assert f"Target: eaglenest-test/kimi-mini: cached in {cache} at commit {commit[:12]}" in out


def test_the_transformers_backend_refuses_a_multimodal_target_by_name(kimi_mini_run, tmp_path):
    from eaglenest.core.errors import EaglenestError
    from eaglenest.hidden_states.extract import extract_shard_transformers
    from eaglenest.target.resolve import load_target

    run = kimi_mini_run["run_dir"]
    target = load_target(run / "target.json")
    with pytest.raises(EaglenestError, match=r"multimodal .*KimiK25ForConditionalGeneration.*backend: vllm"):
        extract_shard_transformers(
            target.path,
            run / "tokenized" / "tokenized_data.jsonl",
            tmp_path / "shard_0",
            num_rows=1,
            shard=0,
            num_shards=1,
            aux_layer_ids=[2, 4, 5],
            dtype="bfloat16",
            meta={},
        )
    assert not (tmp_path / "shard_0").exists()


def test_no_server_is_left_running(kimi_mini_run):
    from eaglenest.engine.server import pid_alive

    server_dir = kimi_mini_run["run_dir"] / ".eaglenest" / "server"
    assert not (server_dir / "lease.json").exists()
    for start in open(server_dir / "starts.log"):
        assert not pid_alive(json.loads(start)["pid"])
