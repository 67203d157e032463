"""Berkeley Function Calling Leaderboard (BFCL) prompts as OpenAI chat rows with tools.

A draft head that is to speed up tool calling must see the target answer prompts that come with
tools. BFCL's questions are such prompts, written against real-looking function schemas. They
ship as data in the ``bfcl-eval`` wheel (Apache-2.0), which is installed ``--no-deps``
(``envs/requirements-models.txt``) and never imported: its ``__init__`` and dependencies (a
pinned numpy, model clients) are not wanted, only its files
``bfcl_eval/data/BFCL_v4_<category>.json``, found through the package's installed metadata.

Each file is JSON *lines*: ``{"id", "question", "function"}``, where ``question`` is a list of
turns, each a list of ``{"role", "content"}`` messages, and ``function`` a list of function
schemas. A row here is ``{"id": "bfcl:<id>", "messages", "tools", "category"}``: the messages of
the entry's first turn (the categories used have exactly one; of an entry with several, only the
first is taken) and its functions as OpenAI tools (`openai_tools`).

Categories
----------
`CATEGORIES` are the single-turn ones whose every prompt comes with tools and asks for a call:
``simple_python``, ``multiple``, ``parallel``, ``parallel_multiple`` (BFCL's written questions)
and ``live_simple``, ``live_multiple``, ``live_parallel``, ``live_parallel_multiple`` (questions
users sent, some with a system message). Not used:

- ``multi_turn_*``: later turns need the results of the earlier calls, run against BFCL's own
  simulated APIs, and the entries carry no tools of their own (``involved_classes`` names them);
- ``memory`` and ``web_search``: likewise no tools in the entry, and answering needs BFCL's
  memory backend or a live web search;
- ``irrelevance`` and ``live_irrelevance``: the right answer is *no* call (they test abstaining),
  so they are not tool-call prompts; ``live_relevance`` (16 entries) asks open questions that
  BFCL ships no answers for, so no call of theirs could be scored;
- ``simple_java`` and ``simple_javascript``: their arguments are Java or JavaScript source that
  BFCL itself sends as strings, rewriting every type to ``string`` with a language hint; the
  schemas here would not be the question BFCL asks. `openai_tools` still converts their types;
- ``format_sensitivity``: not entries, a JSON object of id lists.

Tools
-----
BFCL's schemas are JSON-Schema-like but name types in Python (``dict``, ``float``, ``tuple``),
Java (``String``, ``HashMap``, ``ArrayList``, ...) or not at all (``any``, and once ``""``).
`openai_tools` maps every type, recursively through ``properties``, ``items`` and the like, to
a JSON Schema type by BFCL's own table for OpenAI (``dict`` -> ``object``, ``float`` ->
``number``, ``tuple`` -> ``array``), except that ``any`` drops the ``type`` (any value), where
BFCL says ``string``; BFCL's handler converts two levels deep, this one every level. An unknown type is an error, not a guess. Everything else in a schema
(``default``, ``enum``, ``optional``...) is kept as BFCL sends it, even where it contradicts the
type (a ``None`` default for an integer, string enum values for a boolean): JSON Schema treats
those as annotations or unknown keywords. Function names may contain dots (``math.factorial``),
which OpenAI's ``^[a-zA-Z0-9_-]{1,64}$`` forbids: every other character becomes ``_``, as BFCL
does (`tool_name`), so compare calls with BFCL's answers through `tool_name`.

Train and benchmark
-------------------
A fixed `BENCHMARK_SHARE` of the entries is the tool-call benchmark that evaluation holds out;
training reads only the rest. The split is by *question*, not by id: BFCL asks the same question
in several entries (96 of ``multiple``'s ask ``simple_python``'s questions with more functions
offered; the live sets repeat user queries, some differing only in case or punctuation). In
release 2026.3.23 that is 122 questions in 249 entries of `CATEGORIES`, and the same hash of the
ids would have put 45 of those questions on both sides. `is_benchmark_entry` hashes (sha256) the user messages, lowercased
with every run of non-word characters made one space (`question_key`), so an entry's side is the
same on every machine and run, does not depend on which categories are read or in what order,
and a repeated question is on one side only. ``read_entries(..., part="train")`` and
``part="benchmark"`` are disjoint, in ids and in questions, and together make ``part="all"``.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from eaglenest.core.errors import EaglenestError
from eaglenest.core.io import iter_jsonl

PACKAGE = "bfcl-eval"
VERSION = "2026.3.23"  # the release envs/requirements-models.txt pins
INSTALL = f"pip install --no-deps {PACKAGE}=={VERSION}"
CATEGORIES = (
    "simple_python",
    "multiple",
    "parallel",
    "parallel_multiple",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
)
PARTS = ("train", "benchmark", "all")
BENCHMARK_SHARE = 0.25
# A question is in the benchmark when its hash, read as a 64-bit fraction, falls below the share: a
# larger share only adds entries to the benchmark, never moves one out of it.
_BENCHMARK_BELOW = int(BENCHMARK_SHARE * 2**64)
ROW_ID_PREFIX = "bfcl:"
ROLES = ("system", "user", "assistant")

TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
# BFCL's type names to JSON Schema's: its own GORILLA_TO_OPENAPI table (constants/type_mappings.py),
# JSON Schema's names unchanged. Only "any" differs (below).
JSON_TYPES = {
    **{t: t for t in ("object", "array", "string", "number", "integer", "boolean", "null")},
    # Python
    "dict": "object",
    "float": "number",
    "tuple": "array",
    "list": "array",
    "bool": "boolean",
    # Java and JavaScript
    "String": "string",
    "char": "string",
    "Boolean": "boolean",
    "byte": "integer",
    "short": "integer",
    "long": "integer",
    "Bigint": "integer",
    "double": "number",
    "HashMap": "object",
    "Hashtable": "object",
    "Array": "array",
    "ArrayList": "array",
    "Queue": "array",
    "Stack": "array",
}
# A schema without "type" accepts any value, which is what these mean ("" occurs once, in
# simple_javascript); BFCL's "string" would forbid the numbers and objects they allow.
ANY_TYPES = ("any", "Any", "")
_SUBSCHEMA = ("items", "additionalProperties", "not")
_SUBSCHEMA_LISTS = ("items", "anyOf", "oneOf", "allOf", "prefixItems")


def category_file(category: str) -> Path:
    """The installed file of one BFCL category (found from the package's metadata, not imported)."""
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise EaglenestError(
            f"BFCL prompts need the {PACKAGE} package, which is not installed: {INSTALL} "
            "(envs/setup.sh installs it)"
        ) from None
    path = Path(dist.locate_file(f"bfcl_eval/data/BFCL_v4_{category}.json"))
    if not path.is_file():
        raise EaglenestError(
            f"BFCL category {category!r}: no such file in {PACKAGE} {dist.version} (this reader "
            f"uses {', '.join(CATEGORIES)}; {INSTALL} gives the release it was written for)",
            path,
        )
    return path


def tool_name(bfcl_name: str) -> str:
    """A BFCL function name as a valid OpenAI tool name: each character outside [a-zA-Z0-9_-]
    (in BFCL, dots: ``math.factorial``) becomes ``_``."""
    name = re.sub(r"[^a-zA-Z0-9_-]", "_", bfcl_name)
    if not TOOL_NAME.fullmatch(name):
        raise EaglenestError(f"function {bfcl_name!r}: no valid OpenAI tool name (1 to 64 characters)")
    return name


def json_schema(schema, where: str = "schema") -> dict:
    """BFCL's schema as JSON Schema: every type renamed (`JSON_TYPES`, `ANY_TYPES`) at every
    level; other keywords copied as they are. `where` names the schema in errors."""
    if not isinstance(schema, dict):
        raise EaglenestError(f"{where}: a schema must be an object, not {schema!r}")
    out = {}
    for key, value in schema.items():
        if key == "type":
            if value in ANY_TYPES:
                continue
            if not isinstance(value, str) or value not in JSON_TYPES:
                raise EaglenestError(f"{where}: unknown type {value!r}")
            out[key] = JSON_TYPES[value]
        elif key == "properties":
            if not isinstance(value, dict):
                raise EaglenestError(f"{where}: 'properties' must be an object")
            out[key] = {name: json_schema(sub, f"{where}.{name}") for name, sub in value.items()}
        elif key in _SUBSCHEMA and isinstance(value, dict):
            out[key] = json_schema(value, f"{where}.{key}")
        elif key in _SUBSCHEMA_LISTS and isinstance(value, list):
            out[key] = [json_schema(sub, f"{where}.{key}[{i}]") for i, sub in enumerate(value)]
        else:
            # Values, not schemas (enum, default, required...): a deep copy, so no row shares them.
            out[key] = json.loads(json.dumps(value))
    return out


def openai_tools(functions: list[dict]) -> list[dict]:
    """BFCL function schemas as OpenAI chat tools, ``{"type": "function", "function": {"name",
    "description", "parameters"}}``: names by `tool_name`, parameters by `json_schema`."""
    tools = []
    for function in functions:
        name = tool_name(function["name"])
        parameters = json_schema(function.get("parameters", {"type": "object"}), function["name"])
        if parameters.get("type") != "object":
            raise EaglenestError(f"function {function['name']!r}: parameters must be an object schema")
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": function.get("description", ""),
                    "parameters": parameters,
                },
            }
        )
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise EaglenestError(f"functions {[f['name'] for f in functions]}: tool names repeat once made valid")
    return tools


def question_key(messages: list[dict]) -> str:
    """What makes two entries the same question: their user messages, lowercased, each run of
    non-word characters (spaces, punctuation) made one space."""
    users = [m["content"] for m in messages if m["role"] == "user"]
    return "\n".join(re.sub(r"\W+", " ", text.casefold()).strip() for text in users)


def is_benchmark_entry(messages: list[dict]) -> bool:
    """Whether the entry whose first turn is `messages` (a row's ``messages``) belongs to the
    held-out tool-call benchmark, and so never to training: by the sha256 of its `question_key`."""
    digest = hashlib.sha256(question_key(messages).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") < _BENCHMARK_BELOW


def read_entries(categories: Iterable[str] = CATEGORIES, part: str = "all") -> Iterator[dict]:
    """The entries of `categories` as rows ``{"id", "messages", "tools", "category"}``, in file
    order: all of them, or only the training or the benchmark `part`. The files are found (and
    a missing one reported) at the call; they are read as the rows are taken."""
    if part not in PARTS:
        raise EaglenestError(f"BFCL part {part!r}: one of {', '.join(PARTS)}")
    files = [(category, category_file(category)) for category in categories]
    return _rows(files, part)


def _rows(files: list[tuple[str, Path]], part: str) -> Iterator[dict]:
    for category, path in files:
        for number, entry in enumerate(iter_jsonl(path), 1):
            try:
                row = _row(entry, category)
            except EaglenestError as e:
                raise EaglenestError(f"entry {number}: {e.problem}", path) from None
            if part == "all" or is_benchmark_entry(row["messages"]) == (part == "benchmark"):
                yield row


def _row(entry: dict, category: str) -> dict:
    entry_id = entry.get("id")
    if not isinstance(entry_id, str) or not entry_id:
        raise EaglenestError("an entry without an 'id'")
    question = entry.get("question")
    if not isinstance(question, list) or not question or not isinstance(question[0], list):
        raise EaglenestError(f"entry {entry_id}: 'question' must be a list of turns")
    functions = entry.get("function")
    if not isinstance(functions, list):
        raise EaglenestError(f"entry {entry_id}: no 'function' list (not a single-turn tool category)")
    messages = []
    for message in question[0]:  # the first turn: the only one in single-turn categories
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise EaglenestError(f"entry {entry_id}: a message needs a role, one of {', '.join(ROLES)}")
        if not isinstance(message.get("content"), str):
            raise EaglenestError(f"entry {entry_id}: a message's content must be text")
        messages.append({"role": message["role"], "content": message["content"]})
    if not messages or messages[-1]["role"] != "user":
        raise EaglenestError(f"entry {entry_id}: the first turn must end with a user message")
    try:
        tools = openai_tools(functions)
    except EaglenestError as e:
        raise EaglenestError(f"entry {entry_id}: {e.problem}") from None
    return {"id": ROW_ID_PREFIX + entry_id, "messages": messages, "tools": tools, "category": category}
