"""Bad input fails with a clear error, and the failing stage leaves no output behind.

Every case feeds one bad input to a stage (or to the whole workflow) and checks two things:
the message names the file at fault and says what is wrong with it, and none of the stage's
outputs exists afterwards -- not even a `.NAME.tmp-*` leftover of an atomic write.

Interrupted runs (a server killed mid-regeneration, kill -9 during extraction) are tested
elsewhere.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO, default_config, snakemake, write_config

from eaglenest.core.errors import EaglenestError
from eaglenest.engine.server import group_members

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

PROMPTS = REPO / "data" / "prompts" / "default.jsonl"


# --------------------------------------------------------------------------------------------
# Helpers


def assert_absent(*paths) -> None:
    """None of `paths` exists, and no temporary sibling of an atomic write is left over."""
    for path in map(Path, paths):
        assert not path.exists(), f"{path} exists after a failed stage"
        if path.parent.is_dir():
            leftovers = sorted(p.name for p in path.parent.glob(f".{path.name}.tmp-*"))
            assert not leftovers, f"temporary files left beside {path}: {leftovers}"


def write_jsonl_lines(path: Path, lines: list) -> Path:
    """Rows as JSON lines; a str item is written verbatim (to make a malformed line)."""
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def reply(rid: str, user: str = "What is two plus two?", answer: str = "Four.") -> dict:
    return {
        "id": rid,
        "messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}],
    }


@pytest.fixture(scope="module")
def target(untrained_target) -> Path:
    """The tiny Llama target (real tokenizer, chat template, config); its weights do not matter."""
    return untrained_target


# --------------------------------------------------------------------------------------------
# 1. Malformed JSONL line: prompts and tokenize


def test_prompts_malformed_jsonl_line(tmp_path):
    from eaglenest.data.prompts import prepare_stage

    src = write_jsonl_lines(
        tmp_path / "src.jsonl", [{"prompt": "one"}, {"prompt": "two"}, '{"prompt": oops}']
    )
    out = tmp_path / "out"
    outputs = [out / "prompts.jsonl", out / "eval_prompts.jsonl", out / "prompts_stats.json"]
    with pytest.raises(EaglenestError) as e:
        prepare_stage([{"name": "mine", "type": "jsonl", "path": str(src)}], 1, 0, *outputs)
    msg = str(e.value)
    assert str(src) in msg and "line 3" in msg and "malformed JSON" in msg
    assert_absent(*outputs)


def tokenize_outputs(tmp_path: Path) -> list[Path]:
    out = tmp_path / "tokenized"
    return [out / "tokenized_data.jsonl", out / "token_freq.pt", out / "metadata.json"]


def run_tokenize(target, responses, outputs):
    from eaglenest.data.tokenize import tokenize_stage

    return tokenize_stage(responses, target, 512, "truncate", *outputs)


def test_tokenize_malformed_jsonl_line(tmp_path, target):
    responses = write_jsonl_lines(
        tmp_path / "raw_responses.jsonl", [reply("a"), reply("b"), '{"id": "c", "messages": [}']
    )
    outputs = tokenize_outputs(tmp_path)
    with pytest.raises(EaglenestError) as e:
        run_tokenize(target, responses, outputs)
    msg = str(e.value)
    assert str(responses) in msg and "line 3" in msg and "malformed JSON" in msg
    assert_absent(*outputs)


# --------------------------------------------------------------------------------------------
# 2. Bad conversations: tokenize


@pytest.mark.parametrize(
    "messages, problem",
    [
        ([], "empty conversation"),
        (
            [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
            "no assistant turn",
        ),
        (
            [{"role": "user", "content": "Hi"}, {"role": "robot", "content": "Beep."}],
            "message 1 has unknown role 'robot'",
        ),
    ],
    ids=["empty", "no_assistant", "unknown_role"],
)
def test_tokenize_bad_conversation(tmp_path, target, messages, problem):
    responses = write_jsonl_lines(
        tmp_path / "raw_responses.jsonl", [reply("good"), {"id": "bad", "messages": messages}]
    )
    outputs = tokenize_outputs(tmp_path)
    with pytest.raises(EaglenestError) as e:
        run_tokenize(target, responses, outputs)
    msg = str(e.value)
    assert str(responses) in msg and "record 2 (id 'bad')" in msg and problem in msg
    assert_absent(*outputs)


# --------------------------------------------------------------------------------------------
# 3. Token id outside the vocabulary: tokenize (served ids) and vocab (dict token_freq)


def test_tokenize_served_token_id_outside_vocab(tmp_path, target):
    from eaglenest.target.resolve import load_tokenizer, read_shape

    tok = load_tokenizer(target)
    vocab = read_shape(target).vocab_size
    row = reply("served")
    prompt = tok.apply_chat_template(row["messages"][:-1], tokenize=False, add_generation_prompt=True)
    row["prompt_token_ids"] = tok(prompt, add_special_tokens=False)["input_ids"]
    bad_id = vocab + 7
    row["completion_token_ids"] = [5, bad_id, tok.convert_tokens_to_ids("<|im_end|>")]
    responses = write_jsonl_lines(tmp_path / "raw_responses.jsonl", [reply("good"), row])
    outputs = tokenize_outputs(tmp_path)
    with pytest.raises(EaglenestError) as e:
        run_tokenize(target, responses, outputs)
    msg = str(e.value)
    assert str(responses) in msg and "id 'served'" in msg
    assert f"token id {bad_id} is outside the" in msg and "vocab" in msg
    assert_absent(*outputs)


def vocab_paths(tmp_path: Path):
    from eaglenest.data.vocab import MappingPaths

    out = tmp_path / "vocab"
    paths = MappingPaths.in_dir(out, coverage_plot=out / "vocab_coverage.png")
    return paths, [
        paths.t2d_pt,
        paths.d2t_pt,
        paths.t2d_npy,
        paths.d2t_npy,
        paths.coverage_json,
        paths.coverage_plot,
    ]


def run_vocab(tmp_path, target, freq, draft_vocab_size=64):
    from eaglenest.data.vocab import build_vocab_mapping

    path = tmp_path / "token_freq.pt"
    torch.save(freq, path)
    paths, outputs = vocab_paths(tmp_path)
    outputs[0].parent.mkdir(parents=True, exist_ok=True)  # leftovers would land here
    with pytest.raises(EaglenestError) as e:
        build_vocab_mapping(path, draft_vocab_size, paths, target_config=target)
    assert_absent(*outputs)
    msg = str(e.value)
    assert str(path) in msg
    return msg


def test_vocab_dict_token_id_outside_vocab(tmp_path, target):
    msg = run_vocab(tmp_path, target, {3: 10, 2048: 4, 5000: 1})
    assert "2 token ids out of range for target vocabulary size 2048" in msg
    assert "[2048, 5000]" in msg


# --------------------------------------------------------------------------------------------
# 4. token_freq.pt of the wrong length, negative counts, draft larger than the target


def test_vocab_count_tensor_of_wrong_length(tmp_path, target):
    msg = run_vocab(tmp_path, target, torch.ones(1000, dtype=torch.int64))
    assert "length 1000" in msg and "target vocabulary size is 2048" in msg


def test_vocab_negative_counts(tmp_path, target):
    counts = torch.ones(2048, dtype=torch.int64)
    counts[17] = -3
    msg = run_vocab(tmp_path, target, counts)
    assert "negative counts" in msg and "[17]" in msg


def test_vocab_draft_larger_than_target(tmp_path, target):
    msg = run_vocab(tmp_path, target, torch.ones(2048, dtype=torch.int64), draft_vocab_size=4096)
    assert "draft vocabulary size 4096 exceeds the target vocabulary size 2048" in msg


# --------------------------------------------------------------------------------------------
# 5. Aux layer ids: duplicates, out of range (function, plan stage, workflow)


@pytest.mark.parametrize(
    "ids, problem",
    [
        ([2, 2, 5], "aux_layer_ids [2, 2, 5] has duplicates"),
        ([2, 4, 8], "aux_layer_ids [8] outside the target's layers 0..7"),
        ([-1, 4, 5], "aux_layer_ids [-1] outside the target's layers 0..7"),
    ],
)
def test_resolve_aux_layer_ids_rejects(ids, problem):
    from eaglenest.draft.aux_layers import resolve_aux_layer_ids

    with pytest.raises(EaglenestError) as e:
        resolve_aux_layer_ids(ids, 8, "/models/t/config.json")
    assert str(e.value).startswith(f"/models/t/config.json: {problem}")


def test_plan_stage_out_of_range_aux_id(tmp_path, target):
    from eaglenest.hidden_states.extract import plan_stage

    meta = tmp_path / "metadata.json"
    meta.write_text(json.dumps({"samples_out": 3, "tokens_total": 300}))
    plan = tmp_path / "hidden_states" / "plan.json"
    plan.parent.mkdir()
    with pytest.raises(EaglenestError) as e:
        plan_stage(
            metadata_path=meta,
            target=str(target),
            aux_layer_ids=[2, 4, 11],
            out_dir=plan.parent,
            num_shards=2,
            dtype="bfloat16",
            disk_margin_gb=0,
            plan_path=plan,
        )
    msg = str(e.value)
    assert str(target / "config.json") in msg and "[11] outside the target's layers 0..7" in msg
    assert_absent(plan)


def workflow_config(tmp_path: Path, built_target: Path | None = None, **sections) -> Path:
    """The default config with `sections` merged in; `built_target` replaces the tiny build."""
    cfg = default_config()
    if built_target is not None:
        cfg["target"].update(path=str(built_target), build_tiny=None)
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key].update(value)
        else:
            cfg[key] = value
    return write_config(tmp_path, cfg)


def dry_run_fails(tmp_path, configfile) -> str:
    proc = snakemake(tmp_path, configfile, "-n", check=False, timeout=300)
    assert proc.returncode != 0, proc.stdout[-2000:]
    return proc.stdout + proc.stderr


def test_workflow_rejects_duplicate_aux_ids_at_start(tmp_path, target):
    text = dry_run_fails(
        tmp_path, workflow_config(tmp_path, target, hidden_states={"aux_layer_ids": [2, 2, 5]})
    )
    assert "Error validating config file" in text
    assert "[2, 2, 5] has non-unique elements" in text and "aux_layer_ids" in text
    assert not (tmp_path / "results").exists()


def test_workflow_out_of_range_aux_id_fails_draft_config(tmp_path, target):
    cfg_path = workflow_config(tmp_path, target, hidden_states={"aux_layer_ids": [2, 4, 9]})
    run_dir = tmp_path / default_config()["run_dir"]
    out = run_dir / "draft_config.json"
    proc = snakemake(
        tmp_path, cfg_path, "--cores", "1", str(out.relative_to(tmp_path)), check=False, timeout=300
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text[-3000:]
    problem = f"{target / 'config.json'}: aux_layer_ids [9] outside the target's layers 0..7"
    assert problem in text and "Error in rule draft_config" in text
    assert problem in (run_dir / "logs" / "draft_config.log").read_text()
    assert_absent(out)


# --------------------------------------------------------------------------------------------
# 6. Unknown config keys; 7. missing target path


@pytest.mark.parametrize(
    "sections, key",
    [
        ({"vocab": {"draft_vocab_sise": 5}}, "draft_vocab_sise"),
        ({"run_dri": "results/typo"}, "run_dri"),
    ],
    ids=["nested", "top_level"],
)
def test_workflow_rejects_unknown_config_key(tmp_path, sections, key):
    text = dry_run_fails(tmp_path, workflow_config(tmp_path, **sections))
    assert "Error validating config file" in text
    assert f"Additional properties are not allowed ('{key}' was unexpected)" in text
    assert not (tmp_path / "results").exists()


def test_workflow_rejects_missing_target_path(tmp_path):
    configfile = workflow_config(tmp_path, target={"path": "./nowhere", "build_tiny": None})
    text = dry_run_fails(tmp_path, configfile)
    assert f"config {configfile}: target.path: ./nowhere: target path does not exist" in text
    assert not (tmp_path / "results").exists()


# --------------------------------------------------------------------------------------------
# 8. A server that never becomes healthy (real vLLM)

CPU_ARGS = ("--enforce-eager", "--dtype", "float32", "--max-model-len", "512")
CPU_ENV = (("VLLM_CPU_KVCACHE_SPACE", "1"),)


@pytest.fixture
def started_pids(monkeypatch):
    """The pid of every server `eaglenest.engine.server.start` launches during the test."""
    import eaglenest.engine.server as server_mod

    pids: list[int] = []
    real = server_mod.wait_healthy

    def recording(server, timeout_s):
        pids.append(server.pid)
        return real(server, timeout_s)

    monkeypatch.setattr(server_mod, "wait_healthy", recording)
    return pids


def assert_server_gone(pids: list[int]) -> None:
    from eaglenest.engine.server import pid_alive

    assert len(pids) == 1, pids
    assert not pid_alive(pids[0]), f"server pid {pids[0]} still running"
    assert not group_members(pids[0]), f"server processes left: {group_members(pids[0])}"


@pytest.mark.engine
def test_server_with_broken_config_fails_with_log_tail(tmp_path, started_pids):
    from eaglenest.engine.server import ServerError, ServerSpec, start

    model = tmp_path / "broken"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama", "architectures": [\n')
    log = tmp_path / "run" / "server.log"
    with pytest.raises(ServerError) as e:
        start(ServerSpec(model=str(model), args=CPU_ARGS, env=CPU_ENV), tmp_path / "run", log, timeout_s=240)
    msg = str(e.value)
    assert isinstance(e.value, EaglenestError)
    assert msg.startswith(f"{log}: vLLM server exited during start-up")
    # The tail of the server's own log says what is wrong, naming the file.
    assert "Last lines of its log" in msg
    assert f"{model / 'config.json'}' is not a valid JSON file" in msg
    assert_server_gone(started_pids)


@pytest.mark.engine
def test_server_start_timeout_stops_the_server(tmp_path, target, started_pids):
    from eaglenest.engine.server import ServerError, ServerSpec, start

    log = tmp_path / "run" / "server.log"
    t0 = time.monotonic()
    with pytest.raises(ServerError) as e:
        start(ServerSpec(model=str(target), args=CPU_ARGS, env=CPU_ENV), tmp_path / "run", log, timeout_s=3)
    assert time.monotonic() - t0 < 60  # stopped by SIGTERM, not a long wait
    msg = str(e.value)
    assert msg.startswith(f"{log}: vLLM server not healthy after 3 s")
    assert "Last lines of its log" in msg
    assert f"vllm.entrypoints.openai.api_server --model {target}" in msg
    assert_server_gone(started_pids)


# --------------------------------------------------------------------------------------------
# 9. Contracts between stages: hidden states / vocab / draft config; checkpoint / vocab


TARGET_VOCAB, DRAFT_VOCAB, HIDDEN, AUX = 16, 4, 8, [2, 4, 5]
SELECTED = np.array([0, 3, 7, 12])


def write_contract_inputs(tmp_path: Path, *, manifest_aux=AUX, t2d_size=TARGET_VOCAB, d2t=None) -> dict:
    """A consistent set of fake stage outputs, with one thing changed by the caller."""
    dcfg = tmp_path / "draft_config.json"
    dcfg.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": HIDDEN,
                "vocab_size": TARGET_VOCAB,
                "eaglenest": {
                    "aux_layer_ids": AUX,
                    "target_num_layers": 8,
                    "target_vocab_size": TARGET_VOCAB,
                    "draft_vocab_size": DRAFT_VOCAB,
                    "hidden_size": HIDDEN,
                },
            }
        )
    )
    shards = []
    for k in range(2):
        shard = tmp_path / "hidden_states" / f"shard_{k}"
        shard.mkdir(parents=True)
        aux = manifest_aux if k == 1 else AUX  # the second shard is the odd one
        (shard / "manifest.json").write_text(
            json.dumps(
                {
                    "rows": [k, k + 1],
                    "samples": 1,
                    "tokens": 10,
                    "hidden_size": HIDDEN,
                    "dtype": "bfloat16",
                    "aux_layer_ids": aux,
                    "shard": k,
                    "num_shards": 2,
                }
            )
        )
        shards.append(shard)
    t2d = np.zeros(t2d_size, dtype=bool)
    t2d[SELECTED] = True
    if d2t is None:
        d2t = SELECTED - np.arange(DRAFT_VOCAB)
    vocab = tmp_path / "vocab"
    vocab.mkdir()
    np.save(vocab / "t2d.npy", t2d)
    np.save(vocab / "d2t.npy", np.asarray(d2t, dtype=np.int64))
    torch.save(torch.from_numpy(t2d), vocab / "t2d.pt")
    torch.save(torch.from_numpy(np.asarray(d2t, dtype=np.int64)), vocab / "d2t.pt")
    return {
        "draft_config": dcfg,
        "shards": shards,
        "t2d_npy": vocab / "t2d.npy",
        "d2t_npy": vocab / "d2t.npy",
        "t2d_pt": vocab / "t2d.pt",
        "d2t_pt": vocab / "d2t.pt",
    }


def run_train_stage(tmp_path: Path, f: dict) -> None:
    """The train_draft rule's entry point; the contract check comes before anything else."""
    from eaglenest.training.train import train_stage

    out = tmp_path / "train"
    outputs = [out / "checkpoint", out / "metrics.json", out / "curves.png"]
    try:
        train_stage(
            run_dir=tmp_path / "run",
            target="unused",
            shard_dirs=f["shards"],
            tokenized_path=tmp_path / "tokenized_data.jsonl",
            t2d_npy=f["t2d_npy"],
            d2t_npy=f["d2t_npy"],
            draft_config_path=f["draft_config"],
            hp={},
            gpus=1,
            device="cpu",
            out_checkpoint=outputs[0],
            out_metrics=outputs[1],
            out_curves=outputs[2],
            log_file=tmp_path / "train.log",
        )
    finally:
        assert_absent(*outputs)
        assert not (tmp_path / "run").exists()


def test_contract_consistent_inputs_pass(tmp_path):
    """Consistent stage outputs pass, and the check says what it compared."""
    from eaglenest.training.contracts import check_training_inputs

    f = write_contract_inputs(tmp_path)
    assert check_training_inputs(f["draft_config"], f["shards"], f["t2d_npy"], f["d2t_npy"]) == {
        "shards": 2, "aux_layer_ids": AUX, "hidden_size": HIDDEN,
        "target_vocab_size": TARGET_VOCAB, "draft_vocab_size": DRAFT_VOCAB,
    }  # fmt: skip


def test_contract_shard_aux_ids_differ_from_draft_config(tmp_path):
    f = write_contract_inputs(tmp_path, manifest_aux=[1, 4, 5])
    with pytest.raises(EaglenestError) as e:
        run_train_stage(tmp_path, f)
    msg = str(e.value)
    assert msg.startswith(f"{f['shards'][1] / 'manifest.json'}: ")
    assert f"hidden states from layers [1, 4, 5] but {f['draft_config']} expects [2, 4, 5]" in msg


def test_contract_t2d_of_another_vocab_size(tmp_path):
    f = write_contract_inputs(tmp_path, t2d_size=32)
    with pytest.raises(EaglenestError) as e:
        run_train_stage(tmp_path, f)
    msg = str(e.value)
    assert msg.startswith(f"{f['t2d_npy']}: ")
    assert (
        f"t2d covers 32 target ids but {f['draft_config']} says the target vocabulary has "
        f"{TARGET_VOCAB}" in msg
    )


def test_contract_d2t_disagrees_with_t2d(tmp_path):
    f = write_contract_inputs(tmp_path, d2t=[0, 2, 5, 8])  # points at 0, 3, 7, 11: not 12
    with pytest.raises(EaglenestError) as e:
        run_train_stage(tmp_path, f)
    msg = str(e.value)
    assert msg.startswith(f"{f['d2t_npy']}: ")
    assert f"d2t offsets do not point at the ids t2d selects ({f['t2d_npy']})" in msg


def write_checkpoint(tmp_path: Path, *, aux=AUX, d2t=None, mapping=True) -> Path:
    from safetensors.torch import save_file

    ckpt = tmp_path / "checkpoint"
    ckpt.mkdir()
    t2d = torch.zeros(TARGET_VOCAB, dtype=torch.bool)
    t2d[torch.from_numpy(SELECTED)] = True
    d2t = torch.as_tensor(SELECTED - np.arange(DRAFT_VOCAB) if d2t is None else d2t, dtype=torch.int64)
    weights = {"t2d": t2d, "d2t": d2t} if mapping else {}
    save_file({**weights, "fc.weight": torch.zeros(HIDDEN, 3 * HIDDEN)}, str(ckpt / "model.safetensors"))
    (ckpt / "config.json").write_text(
        json.dumps(
            {
                "speculators_model_type": "eagle3",
                "eagle_aux_hidden_state_layer_ids": aux,
                "draft_vocab_size": DRAFT_VOCAB,
                "transformer_layer_config": {"hidden_size": HIDDEN, "max_position_embeddings": 2048},
                "speculators_config": {"verifier": {"name_or_path": "x"}},
            }
        )
    )
    return ckpt


def run_export(tmp_path: Path, ckpt: Path, f: dict) -> str:
    from eaglenest.evaluation.export import export_stage

    out = tmp_path / "draft"
    with pytest.raises(EaglenestError) as e:
        export_stage(
            ckpt,
            out,
            t2d_pt=f["t2d_pt"],
            d2t_pt=f["d2t_pt"],
            draft_config_path=f["draft_config"],
            target="org/target",
            max_model_len=512,
            hp={},
        )
    assert_absent(out)
    return str(e.value)


def test_export_checkpoint_d2t_differs_from_vocab_stage(tmp_path):
    f = write_contract_inputs(tmp_path)
    ckpt = write_checkpoint(tmp_path, d2t=[0, 2, 5, 8])
    msg = run_export(tmp_path, ckpt, f)
    assert msg == f"{ckpt}: d2t in the checkpoint differs from {f['d2t_pt']}"


def test_export_refuses_a_reduced_vocabulary_checkpoint_without_its_mapping(tmp_path):
    f = write_contract_inputs(tmp_path)
    ckpt = write_checkpoint(tmp_path, mapping=False)
    msg = run_export(tmp_path, ckpt, f)
    assert msg == (
        f"{ckpt / 'model.safetensors'}: no t2d or d2t tensor in the checkpoint, whose draft "
        f"vocabulary of {DRAFT_VOCAB} ids is not the target's {TARGET_VOCAB}"
    )


def test_export_checkpoint_aux_ids_differ_from_draft_config(tmp_path):
    f = write_contract_inputs(tmp_path)
    ckpt = write_checkpoint(tmp_path, aux=[3, 4, 5])
    msg = run_export(tmp_path, ckpt, f)
    assert msg.startswith(
        f"{ckpt / 'config.json'}: aux layer ids [3, 4, 5] in the checkpoint "
        f"differs from [2, 4, 5] in {f['draft_config']}"
    )


def test_regeneration_does_not_resume_answers_of_a_replaced_target(tmp_path):
    """Answers kept for resuming belong to one target: rebuilding it at the same path starts
    afresh instead of passing the old target's answers off as the new one's."""
    from eaglenest.data.regenerate import progress_path

    target = tmp_path / "target"
    target.mkdir()
    (target / "model.safetensors").write_bytes(b"old weights")
    sampling = {"max_tokens": 8, "temperature": 0.0}
    before = progress_path(tmp_path, "server-key", sampling, str(target))
    assert progress_path(tmp_path, "server-key", sampling, str(target)) == before  # resumable
    # Same name and size: only the modification time tells the rebuilt file apart.
    old_mtime = (target / "model.safetensors").stat().st_mtime_ns
    (target / "model.safetensors").write_bytes(b"new weights")
    os.utime(target / "model.safetensors", ns=(old_mtime + 10**9, old_mtime + 10**9))
    assert progress_path(tmp_path, "server-key", sampling, str(target)) != before
