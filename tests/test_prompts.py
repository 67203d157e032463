"""The prepare_prompts stage: schemas, drops, ids, dedupe, sampling, split, sources, errors."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from eaglenest.core.errors import EaglenestError
from eaglenest.data.prompts import (
    BUNDLED_DIR,
    DROP_REASONS,
    normalise_row,
    prepare_stage,
    prompt_id,
)

REPO = Path(__file__).resolve().parent.parent


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def read_jsonl(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def run(tmp_path, sources, eval_samples=0, seed=0, out="out"):
    o = tmp_path / out
    stats = prepare_stage(
        sources, eval_samples, seed, o / "prompts.jsonl", o / "eval_prompts.jsonl", o / "prompts_stats.json"
    )
    return stats, read_jsonl(o / "prompts.jsonl"), read_jsonl(o / "eval_prompts.jsonl")


def plain(n, prefix="q"):
    return [{"prompt": f"{prefix} {i}?"} for i in range(n)]


# ---------------------------------------------------------------------------------- schemas


def test_messages_schema_keeps_history_and_drops_trailing_reply():
    row = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "  What is 2+2?  "},
            {"role": "assistant", "content": "4"},
        ]
    }
    assert normalise_row(row)["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "What is 2+2?"},
    ]


def test_turns_before_the_first_question_are_dropped_but_a_system_turn_stays():
    # ShareGPT's _1, _2 parts of a long conversation open with the model's answer to a question
    # in the part before: kept, it would be history with no question (and masked as an answer).
    part = {
        "conversations": [
            {"from": "system", "value": "sys"},
            {"from": "gpt", "value": "the end of an earlier answer"},
            {"from": "human", "value": "next question"},
            {"from": "gpt", "value": "its answer"},
        ]
    }
    whole = {"conversations": [part["conversations"][0], *part["conversations"][2:]]}
    for answer in (False, True):
        got = normalise_row(part, answer=answer)
        assert got == normalise_row(whole, answer=answer)
        assert [m["role"] for m in got["messages"]] == ["system", "user"]
    assert prompt_id(normalise_row(part)["messages"]) == prompt_id(normalise_row(whole)["messages"])
    only_answers = {"messages": [{"role": "assistant", "content": "no question at all"}]}
    with pytest.raises(Exception) as e:
        normalise_row(only_answers)
    assert getattr(e.value, "reason", None) == "no_user_turn"


def test_sharegpt_schema_maps_roles():
    row = {
        "id": "x",
        "conversations": [
            {"from": "system", "value": "sys"},
            {"from": "human", "value": "a"},
            {"from": "gpt", "value": "b"},
            {"from": "user", "value": "c"},
            {"from": "chatgpt", "value": "d"},
            {"from": "Human", "value": "e"},
            {"from": "bard", "value": "f"},
            {"from": "bing", "value": "g"},
            {"from": "assistant", "value": "h"},
        ],
    }
    roles = [t["role"] for t in normalise_row(row)["messages"]]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]


def test_prompt_schema_and_extra_fields_ignored():
    assert normalise_row({"prompt": "Tell me a joke.", "category": "fun"})["messages"] == [
        {"role": "user", "content": "Tell me a joke."}
    ]


def test_empty_system_turn_is_removed_not_dropped():
    row = {"conversations": [{"from": "system", "value": ""}, {"from": "human", "value": "hi"}]}
    assert normalise_row(row)["messages"] == [{"role": "user", "content": "hi"}]


def test_output_schema(tmp_path):
    src = write_jsonl(tmp_path / "a.jsonl", [{"prompt": "hello"}])
    stats, train, ev = run(tmp_path, [{"name": "a", "type": "jsonl", "path": src}])
    assert train == [
        {
            "id": prompt_id([{"role": "user", "content": "hello"}]),
            "source": "a",
            "mode": "default",
            "messages": [{"role": "user", "content": "hello"}],
        }
    ]
    assert ev == [] and stats["train"] == 1 and stats["eval"] == 0


# ---------------------------------------------------------------------------------- drops


def test_each_drop_reason_counted(tmp_path):
    good = {"prompt": "fine"}
    rows = [
        good,
        {"messages": []},  # empty_conversation
        {"conversations": []},  # empty_conversation
        {"messages": [{"role": "assistant", "content": "only me"}]},  # no_user_turn
        {"messages": [{"role": "system", "content": "s"}]},  # no_user_turn
        {"messages": [{"role": "user", "content": "   "}]},  # empty_content
        {"prompt": ""},  # empty_content
        {
            "messages": [
                {"role": "user", "content": ""},
                {"role": "assistant", "content": "x"},
                {"role": "user", "content": "y"},
            ]
        },  # empty_content
        {
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "tool", "tool_call_id": "c1", "content": "x"},
            ]
        },  # tool_result_without_call
        {"messages": [{"role": "developer", "content": "x"}]},  # unknown_role
        {"conversations": [{"from": "robot", "value": "x"}]},  # unknown_role
        {"messages": [{"role": "user", "content": 5}]},  # malformed
        {"messages": [{"role": "user"}]},  # malformed
        {"messages": [{"content": "no role"}]},  # malformed
        {"messages": "not a list"},  # malformed
        {"messages": ["not a dict"]},  # malformed
        {"conversations": [{"role": "user", "content": "wrong keys"}]},  # malformed
        {"prompt": ["x"]},  # malformed
        {"text": "no known field"},  # malformed
        {"prompt": "fine"},  # duplicate
        {"messages": [{"role": "user", "content": " fine "}]},  # duplicate
    ]
    src = write_jsonl(tmp_path / "a.jsonl", rows)
    stats, train, _ = run(tmp_path, [{"name": "a", "type": "jsonl", "path": src}])
    assert len(train) == 1
    expected = {
        "empty_conversation": 2,
        "no_user_turn": 2,
        "empty_content": 3,
        "unknown_role": 2,
        "tool_result_without_call": 1,
        "malformed": 8,
        "duplicate": 2,
    }
    assert stats["dropped"] == {k: expected.get(k, 0) for k in DROP_REASONS}
    s = stats["sources"]["a"]
    assert s["dropped"] == stats["dropped"]
    assert (s["rows_in"], s["usable"], s["kept"]) == (len(rows), 1, 1)
    assert stats["rows_in"] == len(rows) and stats["kept"] == 1


def test_unknown_role_message():
    with pytest.raises(Exception) as e:
        normalise_row({"messages": [{"role": "x", "content": "hi"}]})
    assert getattr(e.value, "reason", None) == "unknown_role"
    assert "unknown role 'x'" in str(e.value)


# ---------------------------------------------------------------------------------- ids, dedupe


def test_dedupe_across_sources_first_kept(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [{"prompt": "same"}, {"prompt": "only a"}])
    b = write_jsonl(
        tmp_path / "b.jsonl",
        [
            {"conversations": [{"from": "human", "value": "same"}, {"from": "gpt", "value": "r"}]},
            {"prompt": "only b"},
        ],
    )
    stats, train, _ = run(
        tmp_path, [{"name": "a", "type": "jsonl", "path": a}, {"name": "b", "type": "jsonl", "path": b}]
    )
    assert [(r["source"], r["messages"][-1]["content"]) for r in train] == [
        ("a", "same"),
        ("a", "only a"),
        ("b", "only b"),
    ]
    assert stats["sources"]["b"]["dropped"]["duplicate"] == 1
    assert stats["sources"]["a"]["dropped"]["duplicate"] == 0
    assert len({r["id"] for r in train}) == len(train)


def test_two_sources_on_one_file_draw_disjoint_rows_and_a_repeat_within_a_source_is_dropped(tmp_path):
    rows = [
        {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}
        for i in range(40)
    ]
    path = write_jsonl(tmp_path / "one.jsonl", rows + rows[:3])
    stats, train, _ = run(
        tmp_path,
        [
            {"name": "answered", "type": "jsonl", "path": path, "samples": 10},
            {"name": "kept", "type": "jsonl", "path": path, "responses": "dataset", "samples": 25},
        ],
    )
    by = {s: {r["id"] for r in train if r["source"] == s} for s in ("answered", "kept")}
    assert len(by["answered"]) == 10 and len(by["kept"]) == 25
    assert not by["answered"] & by["kept"]
    # Within a source, the file's three repeats; the second also skips the first's ten picks.
    assert stats["sources"]["answered"]["dropped"]["duplicate"] == 3
    assert stats["sources"]["kept"]["dropped"]["duplicate"] == 13
    assert stats["sources"]["kept"]["usable"] == 30


def test_match_keeps_rows_with_a_matching_user_turn_and_counts_the_rest(tmp_path):
    rows = [
        {"messages": [{"role": "system", "content": "python helper"}, {"role": "user", "content": "hello"}]},
        {"prompt": "Fix this Python loop"},
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "python?"},
                {"role": "user", "content": "SQL join please"},
            ]
        },
        {"prompt": "a poem"},
    ]
    path = write_jsonl(tmp_path / "a.jsonl", rows)
    stats, train, _ = run(
        tmp_path, [{"name": "code", "type": "jsonl", "path": path, "match": r"(?i)\b(python|sql)\b"}]
    )
    assert [r["messages"][-1]["content"] for r in train] == ["Fix this Python loop", "SQL join please"]
    assert stats["sources"]["code"]["dropped"]["no_match"] == 2  # a system or assistant turn does not count
    cased = run(tmp_path, [{"name": "code", "type": "jsonl", "path": path, "match": "Python"}], out="cased")[
        1
    ]
    assert [r["messages"][-1]["content"] for r in cased] == ["Fix this Python loop"]  # case as written
    for bad in ("(", "", 3):
        with pytest.raises(EaglenestError, match="prompts source 'code': 'match'"):
            run(tmp_path, [{"name": "code", "type": "jsonl", "path": path, "match": bad}], out="bad")


def test_user_turns_keeps_the_first_exchanges_for_the_target_and_for_the_dataset(tmp_path):
    conversation = {
        "conversations": [
            {"from": "system", "value": "be brief"},
            {"from": "human", "value": "first?"},
            {"from": "gpt", "value": "one"},
            {"from": "human", "value": "second?"},
            {"from": "gpt", "value": "two"},
            {"from": "human", "value": "third?"},
            {"from": "gpt", "value": "three"},
        ]
    }
    path = write_jsonl(tmp_path / "c.jsonl", [conversation])
    for origin in ("target", "dataset"):
        for turns, last_question in ((1, "first?"), (2, "second?"), (3, "third?"), (9, "third?")):
            src = {"name": "c", "type": "jsonl", "path": path, "responses": origin, "user_turns": turns}
            (row,) = run(tmp_path, [src], out=f"{origin}{turns}")[1]
            users = [m["content"] for m in row["messages"] if m["role"] == "user"]
            assert users[-1] == last_question and row["messages"][0]["content"] == "be brief"
            if origin == "dataset":  # the answer to the last kept question, none later
                assert row["answer"][0]["content"] == {1: "one", 2: "two"}.get(turns, "three")
    for bad in (0, -1, 1.5, True):
        with pytest.raises(EaglenestError, match="'user_turns' must be a positive integer"):
            run(tmp_path, [{"name": "c", "type": "jsonl", "path": path, "user_turns": bad}], out="bad")


def test_ids_stable_across_runs_and_formats(tmp_path):
    msgs = [{"role": "user", "content": "Why is the sky blue?"}]
    # sha256 of '[{"content":"Why is the sky blue?","role":"user"}]', first 16 hex digits:
    # hard-coded so a change to the id scheme (which would orphan earlier runs) fails here
    assert prompt_id(msgs) == "86a3490dd079540c"
    src = write_jsonl(tmp_path / "a.jsonl", plain(20))
    sources = [{"name": "a", "type": "jsonl", "path": src}]
    _, t1, e1 = run(tmp_path, sources, eval_samples=5, out="o1")
    _, t2, e2 = run(tmp_path, sources, eval_samples=5, out="o2")
    assert (t1, e1) == (t2, e2)
    # same prompt from a different schema gets the same id
    assert prompt_id(
        normalise_row({"conversations": [{"from": "human", "value": "q 0?"}]})["messages"]
    ) == next(r["id"] for r in t1 + e1 if r["messages"][0]["content"] == "q 0?")


def test_ids_stable_in_a_fresh_interpreter():
    code = "from eaglenest.data.prompts import prompt_id;print(prompt_id([{'role': 'user', 'content': 'héllo'}]))"
    env = dict(os.environ, PYTHONHASHSEED="123")
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout.strip()
    assert other == prompt_id([{"role": "user", "content": "héllo"}])


# ---------------------------------------------------------------------------------- sampling, split


def test_sampling_counts_and_short_source(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", plain(50, "a"))
    b = write_jsonl(tmp_path / "b.jsonl", plain(4, "b"))
    c = write_jsonl(tmp_path / "c.jsonl", plain(7, "c"))
    stats, train, ev = run(
        tmp_path,
        [
            {"name": "a", "type": "jsonl", "path": a, "samples": 10},
            {"name": "b", "type": "jsonl", "path": b, "samples": 9},
            {"name": "c", "type": "jsonl", "path": c, "samples": None},
        ],
        eval_samples=3,
        seed=1,
    )
    sa, sb, sc = (stats["sources"][k] for k in "abc")
    assert (sa["usable"], sa["requested"], sa["kept"], sa["short"]) == (50, 10, 10, False)
    assert (sb["usable"], sb["requested"], sb["kept"], sb["short"]) == (4, 9, 4, True)
    assert (sc["requested"], sc["kept"], sc["short"]) == (None, 7, False)
    assert stats["kept"] == 21 and stats["train"] == 18 and stats["eval"] == 3
    rows = train + ev
    assert sum(r["source"] == "a" for r in rows) == 10
    # without replacement
    assert len({r["id"] for r in rows}) == 21


def test_sampling_depends_on_seed_and_is_deterministic(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", plain(100))
    src = [{"name": "a", "type": "jsonl", "path": a, "samples": 10}]
    ids = lambda out, seed: [r["id"] for r in run(tmp_path, src, 0, seed, out)[1]]  # noqa: E731
    assert ids("x1", 3) == ids("x2", 3)
    assert ids("x1", 3) != ids("x3", 4)


def test_eval_disjoint_from_train_and_deterministic(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", plain(40))
    src = [{"name": "a", "type": "jsonl", "path": a}]
    _, t1, e1 = run(tmp_path, src, eval_samples=8, seed=5, out="r1")
    _, t2, e2 = run(tmp_path, src, eval_samples=8, seed=5, out="r2")
    _, _, e3 = run(tmp_path, src, eval_samples=8, seed=6, out="r3")
    assert len(e1) == 8 and len(t1) == 32
    assert not {r["id"] for r in t1} & {r["id"] for r in e1}
    assert {r["id"] for r in t1} | {r["id"] for r in e1} == {
        prompt_id([{"role": "user", "content": r["prompt"]}]) for r in plain(40)
    }
    assert (t1, e1) == (t2, e2)
    assert e3 != e1


@pytest.mark.parametrize("n_eval", [5, 6])
def test_eval_samples_must_leave_training_rows(tmp_path, n_eval):
    a = write_jsonl(tmp_path / "a.jsonl", plain(5))
    with pytest.raises(EaglenestError, match="eval_samples"):
        run(tmp_path, [{"name": "a", "type": "jsonl", "path": a}], eval_samples=n_eval)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


# ---------------------------------------------------------------------------------- sources


def test_bundled_default_resolves_from_another_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    stats, train, ev = run(tmp_path, [{"name": "default", "type": "bundled"}], eval_samples=16)
    assert BUNDLED_DIR == REPO / "data" / "prompts"
    assert stats["sources"]["default"]["path"] == str(REPO / "data" / "prompts" / "default.jsonl")
    assert stats["kept"] >= 150 and sum(stats["dropped"].values()) == 0
    assert len(ev) == 16 and len(train) == stats["kept"] - 16


def test_bundled_default_file_quality():
    rows = read_jsonl(BUNDLED_DIR / "default.jsonl")
    assert 1400 <= len(rows) <= 1600
    msgs = [normalise_row(r)["messages"] for r in rows]  # all usable
    assert len({prompt_id(m) for m in msgs}) == len(rows)
    assert sum(m[0]["role"] == "system" for m in msgs) >= 5
    assert sum(any(t["role"] == "assistant" for t in m) for m in msgs) >= 5
    firsts = {m[-1]["content"].split()[0].lower() for m in msgs}
    assert len(firsts) >= 100  # varied openings, not one template


def test_bundled_prompts_are_new_to_the_tiny_target():
    """The default target answers prompts it never trained on, as a served model does: no
    bundled prompt shares a message with the tiny target's corpus."""
    corpus = read_jsonl(REPO / "data" / "tiny_target" / "corpus.jsonl")
    seen = {m["content"].strip().lower() for row in corpus for m in row["messages"]}
    prompts = read_jsonl(BUNDLED_DIR / "default.jsonl")
    overlap = [r for r in prompts if any(m["content"].strip().lower() in seen for m in r["messages"])]
    assert overlap == []


def test_bundled_named_file_and_missing(tmp_path):
    with pytest.raises(EaglenestError, match="does not exist") as e:
        run(tmp_path, [{"name": "x", "type": "bundled", "path": "nope.jsonl"}])
    assert str(BUNDLED_DIR / "nope.jsonl") in str(e.value)


def test_parquet_source(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(
        [
            {"messages": [{"role": "user", "content": "p1"}, {"role": "assistant", "content": "r"}]},
            {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "p2"}]},
            {"messages": []},
            {"messages": None},
        ]
    )
    pq.write_table(table, tmp_path / "p.parquet")
    stats, train, _ = run(tmp_path, [{"name": "pq", "type": "parquet", "path": str(tmp_path / "p.parquet")}])
    assert [r["messages"] for r in train] == [
        [{"role": "user", "content": "p1"}],
        [{"role": "system", "content": "s"}, {"role": "user", "content": "p2"}],
    ]
    assert stats["dropped"]["empty_conversation"] == 1
    assert stats["dropped"]["malformed"] == 1


def test_parquet_not_parquet(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    with pytest.raises(EaglenestError, match="parquet") as e:
        run(tmp_path, [{"name": "pq", "type": "parquet", "path": str(bad)}])
    assert str(bad) in str(e.value)


HF_SCRIPT = textwrap.dedent("""
    import json, sys
    import pyarrow as pa, pyarrow.parquet as pq
    from pathlib import Path
    from eaglenest.core.errors import EaglenestError
    from eaglenest.data.prompts import prepare_stage

    tmp = Path(sys.argv[1])
    (tmp / "sharegpt" / "data").mkdir(parents=True)
    with open(tmp / "sharegpt" / "data" / "train.jsonl", "w") as f:
        for i in range(6):
            f.write(json.dumps({"conversations": [
                {"from": "human", "value": f"hf q{i}"}, {"from": "gpt", "value": "a"}]}) + "\\n")
    (tmp / "uc" / "data").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(
        [{"prompt": f"uc {i}", "messages": [{"role": "user", "content": f"uc {i}"}]}
         for i in range(4)]), tmp / "uc" / "data" / "train_sft-00000-of-00001.parquet")
    out = {}
    stats = prepare_stage(
        [{"name": "sg", "type": "hf", "dataset": str(tmp / "sharegpt"), "samples": 4},
         {"name": "uc", "type": "hf", "dataset": str(tmp / "uc"), "split": "train_sft"}],
        2, 0, tmp / "o" / "t.jsonl", tmp / "o" / "e.jsonl", tmp / "o" / "s.json")
    out["stats"] = stats
    out["rows"] = [json.loads(l) for l in open(tmp / "o" / "t.jsonl")] + \\
                  [json.loads(l) for l in open(tmp / "o" / "e.jsonl")]
    for label, src in [
        ("missing", {"name": "m", "type": "hf", "dataset": str(tmp / "absent")}),
        ("hub", {"name": "h", "type": "hf", "dataset": "someone/not-here"}),
        ("split", {"name": "s", "type": "hf", "dataset": str(tmp / "uc"), "split": "test"}),
    ]:
        try:
            prepare_stage([src], 0, 0, tmp / label / "t", tmp / label / "e", tmp / label / "s")
            out[label] = None
        except EaglenestError as e:
            out[label] = str(e)
        assert not (tmp / label).exists() or not any((tmp / label).iterdir())
    print(json.dumps(out))
""")


def test_hf_source_on_local_datasets_offline(tmp_path):
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HF_HOME=str(tmp_path / "hf_home"),
        HF_DATASETS_CACHE=str(tmp_path / "hf_cache"),
    )
    proc = subprocess.run(
        [sys.executable, "-c", HF_SCRIPT, str(tmp_path)], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    stats = out["stats"]
    assert stats["sources"]["sg"]["usable"] == 6 and stats["sources"]["sg"]["kept"] == 4
    assert stats["sources"]["uc"]["kept"] == 4 and stats["sources"]["uc"]["type"] == "hf"
    assert stats["train"] == 6 and stats["eval"] == 2
    sg = [r for r in out["rows"] if r["source"] == "sg"]
    assert all(r["messages"] == [{"role": "user", "content": r["messages"][0]["content"]}] for r in sg)
    for label in ("missing", "hub", "split"):
        assert out[label] is not None and "cannot load Hugging Face dataset" in out[label]
    assert "someone/not-here" in out["hub"]
    assert "'test'" in out["split"]


# ---------------------------------------------------------------------------------- errors


def test_malformed_jsonl_line_names_file_and_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"prompt": "ok"}\n\n{"prompt": "ok2"}\n{"prompt": oops}\n')
    with pytest.raises(EaglenestError) as e:
        run(tmp_path, [{"name": "a", "type": "jsonl", "path": str(p)}])
    assert str(p) in str(e.value) and "line 4" in str(e.value)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize(
    "sources, match",
    [
        ([{"name": "a", "type": "csv", "path": "x.csv"}], "unknown type 'csv'"),
        ([{"name": "a", "type": "jsonl", "path": "/definitely/not/here.jsonl"}], "does not exist"),
        ([{"name": "a", "type": "parquet", "path": "/definitely/not/here.parquet"}], "does not exist"),
        ([{"type": "bundled"}], "name"),
        ([{"name": "a", "type": "jsonl"}], "needs a 'path'"),
        ([{"name": "a", "type": "hf"}], "needs a 'dataset'"),
        ([{"name": "a", "type": "bundled", "samples": 0}], "samples"),
        ([{"name": "a", "type": "bundled", "samples": "10"}], "samples"),
        ([{"name": "a", "type": "bundled", "weight": 2}], "'weight' is not supported"),
        ([{"name": "a", "type": "bundled", "sample": 2}], "unknown key"),
        ([{"name": "a", "type": "bundled"}, {"name": "a", "type": "bundled"}], "unique"),
        ([], "non-empty list"),
    ],
)
def test_config_and_source_errors_write_nothing(tmp_path, sources, match):
    with pytest.raises(EaglenestError, match=match):
        run(tmp_path, sources, eval_samples=1)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_source_with_no_usable_rows_is_an_error(tmp_path):
    good = write_jsonl(tmp_path / "good.jsonl", plain(5))
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"messages": []}, {"prompt": 3}])
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    for path in (bad, str(empty)):
        with pytest.raises(EaglenestError, match="no usable rows") as e:
            run(
                tmp_path,
                [{"name": "g", "type": "jsonl", "path": good}, {"name": "b", "type": "jsonl", "path": path}],
            )
        assert path in str(e.value) and "'b'" in str(e.value)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_failure_while_writing_leaves_no_output(tmp_path, monkeypatch):
    import eaglenest.data.prompts as mod

    a = write_jsonl(tmp_path / "a.jsonl", plain(5))
    calls = []

    def boom(path, rows):
        calls.append(path)
        if len(calls) == 2:
            raise OSError("disk full")
        Path(path).write_text("partial\n")

    monkeypatch.setattr(mod, "_dump_jsonl", boom)
    with pytest.raises(OSError, match="disk full"):  # the failure itself, not one it caused
        run(tmp_path, [{"name": "a", "type": "jsonl", "path": a}], eval_samples=1)
    assert list((tmp_path / "out").iterdir()) == []


def test_snakemake_script_adapter(tmp_path):
    """The adapter runs with a stand-in `snakemake` object and logs to the log file."""
    from types import SimpleNamespace

    out = tmp_path / "res"
    snakemake = SimpleNamespace(
        params=SimpleNamespace(
            sources=[{"name": "default", "type": "bundled", "samples": 30}],
            eval_samples=4,
            seed=1,
            modes=[{"name": "default"}],
            benchmarks=[{"name": "mt_bench", "type": "mt_bench"}],
        ),
        output=SimpleNamespace(
            train=str(out / "prompts.jsonl"), eval=str(out / "eval.jsonl"), stats=str(out / "stats.json")
        ),
        log=[str(tmp_path / "log.txt")],
    )
    code = (REPO / "scripts" / "prepare_prompts.py").read_text()
    import logging

    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        root.handlers = []
        exec(compile(code, "prepare_prompts.py", "exec"), {"snakemake": snakemake})
        for h in root.handlers:
            h.flush()
    finally:
        for h in root.handlers:
            h.close()
        root.handlers, root.level = saved
    stats = json.loads((out / "stats.json").read_text())
    assert stats["train"] == 26 and stats["eval"] == 4
    assert "26 train, 4 eval" in (tmp_path / "log.txt").read_text()


# ---------------------------------------------------------------------------------- tool rows, modes

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
CALLS = [
    {"id": "functions.get_weather:0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
    {"id": "functions.get_weather:1", "type": "function", "function": {"name": "get_weather", "arguments": '{ "city": "Rome" }'}},
]  # fmt: skip


def tool_row(**over):
    row = {
        "tools": json.dumps([TOOL]),  # a JSON string, as many datasets store it
        "messages": [
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {"role": "assistant", "content": None, "reasoning_content": "Two cities.", "tool_calls": CALLS},
            {"role": "tool", "tool_call_id": "functions.get_weather:1", "content": "Rainy"},
            {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": " Sunny "},
            {"role": "assistant", "content": "Sunny in Paris, rainy in Rome."},
        ],
    }
    row.update(over)
    return row


def test_tool_rows_keep_tools_and_record_the_results_after_the_prompt():
    prompt = normalise_row(tool_row())
    assert prompt["messages"] == [{"role": "user", "content": "Weather in Paris and Rome?"}]
    assert prompt["tools"] == [TOOL]
    # The results the tool loop answers with, named after their calls, in order, bytes kept.
    assert prompt["tool_results"] == [
        {"name": "get_weather", "content": "Rainy"},
        {"name": "get_weather", "content": " Sunny "},
    ]
    # A finished loop in the history stays in the prompt, ids and argument strings byte for byte.
    history = tool_row()["messages"] + [{"role": "user", "content": "And Oslo?"}]
    prompt = normalise_row(tool_row(messages=history))
    assert [m["role"] for m in prompt["messages"]] == [
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "user",
    ]
    assert prompt["messages"][1]["tool_calls"] == CALLS
    assert prompt["messages"][1]["reasoning_content"] == "Two cities."
    assert "tool_results" not in prompt


@pytest.mark.parametrize(
    ("broken", "reason"),
    [
        (lambda m: [m[0], m[1], m[2], m[4]], "call_without_result"),  # one parallel call unanswered
        (lambda m: [m[0], {**m[2], "tool_call_id": "nope"}, m[4]], "tool_result_without_call"),
        (
            lambda m: [m[0], {**m[1], "tool_calls": [{"function": {"name": "x"}}]}, m[4]],
            "malformed_tool_call",
        ),
        (lambda m: [m[0], {"role": "robot", "content": "x"}, m[4]], "unknown_role"),
    ],
)
def test_tool_protocol_breaks_are_counted_by_reason_and_named(tmp_path, broken, reason):
    rows = [tool_row(), tool_row(id="bad-1", messages=broken(tool_row()["messages"])), {"prompt": "fine"}]
    src = write_jsonl(tmp_path / "a.jsonl", rows)
    stats, train, _ = run(tmp_path, [{"name": "a", "type": "jsonl", "path": src}])
    assert stats["dropped"][reason] == 1 and sum(stats["dropped"].values()) == 1
    named = stats["sources"]["a"]["dropped_examples"][reason]
    assert len(named) == 1 and named[0].startswith("row 2 (id 'bad-1')")
    assert len(train) == 2 and stats["with_tools"]["train"] == 1


def test_malformed_tools_are_counted():
    with pytest.raises(Exception) as e:
        normalise_row(tool_row(tools="{not json"))
    assert getattr(e.value, "reason", None) == "malformed_tools"


def test_modes_split_the_prompts_by_share_and_a_row_keeps_its_own(tmp_path):
    rows = [{"prompt": f"q {i}?"} for i in range(400)] + [{"prompt": "mine", "mode": "instant"}]
    rows.append({"prompt": "unknown", "mode": "turbo"})
    src = write_jsonl(tmp_path / "a.jsonl", rows)
    modes = [
        {"name": "thinking", "share": 3},
        {"name": "instant", "chat_template_kwargs": {"thinking": False}},
    ]
    out = tmp_path / "out"
    stats = prepare_stage([{"name": "a", "type": "jsonl", "path": src}], 0, 0,
                          out / "p.jsonl", out / "e.jsonl", out / "s.json", modes=modes)  # fmt: skip
    train = read_jsonl(out / "p.jsonl")
    by_mode = {m: sum(r["mode"] == m for r in train) for m in ("thinking", "instant")}
    assert sum(by_mode.values()) == 401 and 0.65 < by_mode["thinking"] / 401 < 0.85  # 3:1
    assert next(r for r in train if r["messages"][0]["content"] == "mine")["mode"] == "instant"
    assert stats["dropped"]["unknown_mode"] == 1
    assert stats["modes"]["train"] == by_mode
    # A row's mode depends on its id alone: adding rows leaves the others' modes as they were.
    src2 = write_jsonl(tmp_path / "b.jsonl", rows[:200])
    prepare_stage([{"name": "a", "type": "jsonl", "path": src2}], 0, 0,
                  out / "p2.jsonl", out / "e2.jsonl", out / "s2.json", modes=modes)  # fmt: skip
    first = {r["id"]: r["mode"] for r in train}
    assert all(first[r["id"]] == r["mode"] for r in read_jsonl(out / "p2.jsonl"))


def test_bfcl_source_reads_the_training_part_with_tools(tmp_path):
    from eaglenest.data import bfcl

    _, train, _ = run(tmp_path, [{"name": "bfcl", "type": "bfcl", "categories": ["parallel"], "samples": 20}])
    assert len(train) == 20 and all(r["tools"] and r["tools"][0]["type"] == "function" for r in train)
    held_out = {bfcl.question_key(r["messages"]) for r in bfcl.read_entries(["parallel"], part="benchmark")}
    assert not held_out & {bfcl.question_key(r["messages"]) for r in train}
    with pytest.raises(EaglenestError, match="categories"):
        run(tmp_path, [{"name": "bfcl", "type": "bfcl", "categories": ["nope"]}], out="o2")
