"""BFCL prompts with tools (eaglenest/data/bfcl.py), read from the installed bfcl-eval wheel's own
files: every category reads, every tool is a valid OpenAI tool, the train/benchmark split."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import hashlib
import importlib.metadata
import json
import re
import sys
from pathlib import Path

import pytest

from eaglenest.core.errors import EaglenestError
from eaglenest.data import bfcl

REPO = Path(__file__).resolve().parents[1]
JSON_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}
OPENAI_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
# Each type name the shipped schemas use, as JSON Schema names it (None: no type, any value).
EXPECTED_TYPES = {
    **{t: t for t in JSON_TYPES},
    **{"dict": "object", "float": "number", "tuple": "array", "any": None, "": None},
    **{"String": "string", "char": "string", "Boolean": "boolean", "long": "integer", "double": "number"},
    **{"HashMap": "object", "Array": "array", "ArrayList": "array"},
}
# The sha256 of the benchmark part's sorted ids (one a line) in bfcl-eval 2026.3.23.
BENCHMARK_IDS_SHA256 = "81662df1597012b0ba516e14015f2a9ead2bed0e86288e65410472337156ceea"


def all_rows(part="all"):
    return list(bfcl.read_entries(bfcl.CATEGORIES, part=part))


def data_files() -> dict[str, Path]:
    """Every BFCL_v4_<category>.json the wheel ships at the top of its data folder."""
    files = importlib.metadata.distribution("bfcl-eval").files
    found = {}
    for f in files:
        match = re.fullmatch(r"bfcl_eval/data/BFCL_v4_(\w+)\.json", str(f).replace("\\", "/"))
        if match:
            found[match.group(1)] = Path(f.locate())
    return found


def tool_categories() -> list[str]:
    """The shipped categories whose entries carry their functions (used or not): every schema
    in the package that a tool could be made of."""
    names = []
    for category, path in data_files().items():
        first = path.read_text(encoding="utf-8").splitlines()[0]
        try:
            entry = json.loads(first)
        except json.JSONDecodeError:
            continue  # format_sensitivity: one JSON object over many lines, not entries
        if "function" in entry:
            names.append(category)
    return sorted(names)


def schema_problems(schema, where) -> list[str]:
    """What makes `schema` invalid as JSON Schema for an OpenAI tool, walked through every
    subschema (property names are not keywords: a property may be called "type")."""
    if not isinstance(schema, dict):
        return [f"{where}: not an object"]
    problems = []
    if "type" in schema and schema["type"] not in JSON_TYPES:
        problems.append(f"{where}: type {schema['type']!r}")
    if "properties" in schema:
        if not isinstance(schema["properties"], dict):
            problems.append(f"{where}: properties is not an object")
        else:
            for name, sub in schema["properties"].items():
                problems += schema_problems(sub, f"{where}.{name}")
    if "required" in schema and not (
        isinstance(schema["required"], list) and all(isinstance(r, str) for r in schema["required"])
    ):
        problems.append(f"{where}: required is not a list of names")
    for key in ("items", "additionalProperties", "not"):
        if isinstance(schema.get(key), dict):
            problems += schema_problems(schema[key], f"{where}.{key}")
    for key in ("items", "anyOf", "oneOf", "allOf", "prefixItems"):
        if isinstance(schema.get(key), list):
            for i, sub in enumerate(schema[key]):
                problems += schema_problems(sub, f"{where}.{key}[{i}]")
    return problems


def tool_problems(tool) -> list[str]:
    if set(tool) != {"type", "function"} or tool["type"] != "function":
        return [f"not an OpenAI tool: {sorted(tool)}"]
    function = tool["function"]
    name = function.get("name", "")
    problems = [] if OPENAI_NAME.match(name) else [f"name {name!r}"]
    if not isinstance(function.get("description"), str):
        problems.append(f"{name}: description is not text")
    parameters = function.get("parameters")
    if not isinstance(parameters, dict) or parameters.get("type") != "object":
        return [*problems, f"{name}: parameters is not an object schema"]
    return problems + schema_problems(parameters, name)


def test_every_category_reads_as_chat_rows_with_tools():
    rows = all_rows()
    by_category = {c: [r for r in rows if r["category"] == c] for c in bfcl.CATEGORIES}
    assert all(by_category.values()), {c: len(r) for c, r in by_category.items()}
    ids = [r["id"] for r in rows]
    assert len(set(ids)) == len(ids)
    for row in rows:
        assert set(row) == {"id", "messages", "tools", "category"}
        assert row["id"] == f"bfcl:{row['id'][5:]}" and row["id"][5:].startswith(row["category"])
        assert row["messages"] and row["messages"][-1]["role"] == "user"
        assert all(set(m) == {"role", "content"} and m["content"].strip() for m in row["messages"])
        assert row["tools"], row["id"]
    # The live sets keep the system messages their users sent.
    assert any(m["role"] == "system" for r in by_category["live_multiple"] for m in r["messages"])
    # Reading is data only: the package's code (and its numpy pin) is never imported.
    assert "bfcl_eval" not in sys.modules


def test_every_shipped_function_converts_to_a_valid_openai_tool():
    """Every schema in the package, used categories or not, so no type that occurs is missed."""
    categories = tool_categories()
    assert set(bfcl.CATEGORIES) <= set(categories)
    tools = 0
    for row in bfcl.read_entries(categories):
        for tool in row["tools"]:
            assert not tool_problems(tool), (row["id"], tool_problems(tool))
            tools += 1
    assert tools > 8000


def renamed_only(original, converted, where) -> list[str]:
    """Where `converted` differs from BFCL's `original` other than in a type's name (or a type
    dropped for "any"): nothing but types may change."""
    if not isinstance(original, dict):
        return [] if original == converted else [where]
    problems = []
    for key, value in original.items():
        if key == "type":
            expected = EXPECTED_TYPES[value]
            if converted.get("type") != expected:
                problems.append(f"{where}: {value!r} became {converted.get('type')!r}")
        elif key == "properties":
            problems += [
                p
                for name, sub in value.items()
                for p in renamed_only(sub, converted[key][name], f"{where}.{name}")
            ]
        elif key == "items" and isinstance(value, dict):
            problems += renamed_only(value, converted[key], f"{where}.items")
        elif converted.get(key) != value:
            problems.append(f"{where}: {key} changed")
    return problems


def test_conversion_renames_types_and_names_and_keeps_everything_else():
    seen_types = set()  # of those in EXPECTED_TYPES (an unknown one fails in renamed_only)
    for category in tool_categories():
        for line in data_files()[category].read_text(encoding="utf-8").splitlines():
            functions = json.loads(line)["function"]
            for function, tool in zip(functions, bfcl.openai_tools(functions)):
                converted = tool["function"]
                assert converted["name"] == function["name"].replace(".", "_")
                assert converted["description"] == function["description"]
                assert not renamed_only(function["parameters"], converted["parameters"], function["name"])
                seen_types |= set(re.findall(r'"type": "(\w*)"', json.dumps(function["parameters"])))
    # Every non-JSON-Schema type expected occurs in this release, so each was converted above.
    assert set(EXPECTED_TYPES) - JSON_TYPES <= seen_types


def test_train_and_benchmark_are_disjoint_and_make_all_entries():
    train, benchmark, everything = all_rows("train"), all_rows("benchmark"), all_rows("all")
    train_ids, benchmark_ids = {r["id"] for r in train}, {r["id"] for r in benchmark}
    assert not train_ids & benchmark_ids
    assert train_ids | benchmark_ids == {r["id"] for r in everything}
    assert len(train) + len(benchmark) == len(everything)
    # Disjoint in questions too: BFCL asks some questions in several entries.
    train_questions = {bfcl.question_key(r["messages"]) for r in train}
    assert not train_questions & {bfcl.question_key(r["messages"]) for r in benchmark}
    assert 0.2 < len(benchmark) / len(everything) < 0.3
    for category in bfcl.CATEGORIES:  # every category is in both parts
        assert any(r["category"] == category for r in train)
        assert any(r["category"] == category for r in benchmark)


def test_the_split_is_stable():
    first = [r["id"] for r in all_rows("benchmark")]
    assert first == [r["id"] for r in all_rows("benchmark")]
    # Reading one category alone, or in another order, puts its entries on the same side.
    alone = [r["id"] for r in bfcl.read_entries(["live_simple"], part="benchmark")]
    assert alone == [i for i in first if i.startswith("bfcl:live_simple_")]
    reversed_order = {r["id"] for r in bfcl.read_entries(bfcl.CATEGORIES[::-1], part="benchmark")}
    assert reversed_order == set(first)
    # The benchmark of the pinned release, as first drawn: a change that reshuffles it (of the
    # hash, the key or the share) fails here, as it would change every earlier figure's prompts.
    assert len(first) == 618
    digest = hashlib.sha256("\n".join(sorted(first)).encode()).hexdigest()
    assert digest == BENCHMARK_IDS_SHA256


def test_a_missing_package_names_it_and_the_install_command(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    with pytest.raises(EaglenestError, match=r"bfcl-eval.*pip install --no-deps bfcl-eval==2026\.3\.23"):
        bfcl.read_entries()


def test_a_missing_category_or_part_is_named():
    with pytest.raises(EaglenestError, match="no_such_category") as raised:
        bfcl.read_entries(["no_such_category"])
    assert raised.value.path.endswith("BFCL_v4_no_such_category.json")
    with pytest.raises(EaglenestError, match="one of train, benchmark, all"):
        bfcl.read_entries(part="test")
    # A category whose entries carry no tools of their own is not read as if it had none.
    with pytest.raises(EaglenestError, match="no 'function' list"):
        next(bfcl.read_entries(["multi_turn_base"]))


def test_the_pinned_release_is_the_one_installed_and_setup_installs():
    assert importlib.metadata.version("bfcl-eval") == bfcl.VERSION
    requirements = (REPO / "envs/requirements-models.txt").read_text().splitlines()
    assert f"bfcl-eval=={bfcl.VERSION}" in requirements
