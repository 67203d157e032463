"""Regenerate responses with the target itself, so the draft learns what the target says.

Each prompt goes to the target's vLLM server (OpenAI chat API) with bounded concurrency, over
aiohttp, the HTTP client of vLLM's own load generator: on the same server the OpenAI SDK's httpx
transport kept only a third to a half of the requests in the engine at a time
(benchmarks/bench_regeneration.py). Every
finished response is appended at once to a progress file kept outside Snakemake's outputs
(Snakemake deletes a job's outputs before rerunning it), keyed by the server, the target's files
and the sampling spec: a rerun after a crash sends only the prompts not yet answered, and a
rebuilt target starts afresh. When all are answered the progress is
written to `raw_responses.jsonl` in prompt order, atomically.

A prompt whose source ships its answer (``"responses": "dataset"``, eaglenest.data.origins) is
never sent: its answer goes to `raw_responses.jsonl` as it came, in the shape of a regenerated
answer without served ids (tokenize renders it). The server starts only when some prompt is left
to send (`ServerOnDemand`): a run of dataset answers, or one whose answers the progress file
holds already, starts none.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from eaglenest.core.errors import EaglenestError
from eaglenest.core.io import iter_jsonl, room_for, write_jsonl
from eaglenest.data.modes import DEFAULT_MODE, DEFAULT_MODES, check_folder_switches, checked_modes
from eaglenest.data.origins import DATASET, TARGET, response_origin
from eaglenest.engine.server import SERVED_NAME, Server, ServerSpec, StallWatch, serving
from eaglenest.pipeline.workflow import with_parsers

log = logging.getLogger(__name__)


# Bump when the record format changes, so a rerun does not resume from old-format answers.
RECORD_FORMAT = 5


def target_fingerprint(target: str) -> str:
    """A local target's file names, sizes and modification times (a hub id as it is)."""
    path = Path(target)
    if not path.is_dir():
        return target
    return json.dumps(
        sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in path.iterdir() if f.is_file())
    )


def progress_path(run_dir, model: str, sampling: dict, target: str, loop: dict | None = None) -> Path:
    """The progress file of one regeneration: keyed by everything that decides its answers (the
    modes and the tool loop's settings where they are not the defaults)."""
    spec = {
        "model": model,
        "sampling": sampling,
        "format": RECORD_FORMAT,
        "target": target_fingerprint(target),
    }
    if loop:
        spec["loop"] = loop
    spec = json.dumps(spec, sort_keys=True)
    key = hashlib.sha256(spec.encode()).hexdigest()[:12]
    return Path(run_dir) / ".eaglenest" / "regenerate" / f"progress-{key}.jsonl"


def _answered_mode(record: dict) -> str:
    responses = record.get("responses") or [{}]
    return responses[0].get("mode") or DEFAULT_MODE


def load_progress(path: Path) -> dict[str, dict]:
    """Answered ids from an earlier, interrupted run (failed ones are retried). A last line cut
    short (a kill, a full disk) is removed, so the answers appended next start on a line of
    their own."""
    done: dict[str, dict] = {}
    if not path.exists():
        return done
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with open(path, "r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)
    for row in _progress_records(path):
        if "error" not in row:
            done[row["id"]] = row  # the last answer of an id wins
    return done


def _progress_records(path: Path):
    """Every whole record of a progress file, in the order written."""
    with open(path) as f:
        for line in f:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def _room_needed(progress_file: Path, answered: int, to_send: int, prompts: int) -> int:
    """About the bytes still to write: the answers to send and the final file, at the size of
    the answers so far (4 kB each before the first)."""
    per = progress_file.stat().st_size / answered if answered and progress_file.exists() else 4096
    return int(per * (to_send + prompts))


class Progress:
    """Rate and ETA lines for the rule's log."""

    def __init__(self, total: int, every_s: float = 5.0):
        self.total, self.done, self.every_s = total, 0, every_s
        self.t0 = self.last = time.monotonic()

    def step(self, force: bool = False) -> None:
        self.done += 1
        now = time.monotonic()
        if force or now - self.last >= self.every_s or self.done == self.total:
            self.last = now
            rate = self.done / max(now - self.t0, 1e-9)
            eta = (self.total - self.done) / rate if rate else float("inf")
            bar = "#" * int(20 * self.done / max(self.total, 1))
            log.info("[%-20s] %d/%d responses, %.2f/s, ETA %.0f s", bar, self.done, self.total, rate, eta)


class RequestFailed(Exception):
    """The server answered a request with an HTTP error (its status and message)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status

    @property
    def retryable(self) -> bool:
        # A rejected request (a prompt over max_model_len, a bad parameter) fails the same
        # way every time; a timeout, a rate limit or a server error may not.
        return self.status >= 500 or self.status in (408, 429)


# Above this share of failed prompts the stage fails: the training data would be mostly
# missing, which would otherwise surface stages later (an all-zero vocabulary count).
MAX_FAILED_SHARE = 0.5


async def _chat(session, url: str, body: dict) -> dict:
    async with session.post(url, json=body) as res:
        if res.status >= 400:
            raise RequestFailed(res.status, (await res.text())[:500])
        return await res.json()


async def _post(session, url: str, body: dict, pid: str, max_retries: int, watch: StallWatch) -> dict:
    """One chat request, retried with backoff where a retry may help; raises the last failure."""
    import aiohttp

    delay = 1.0
    for attempt in range(max_retries + 1):
        try:
            res = await _chat(session, url, body)
            watch.answered()
            return res
        except (aiohttp.ClientError, asyncio.TimeoutError, RequestFailed) as e:
            watch.check(e)  # a dead or hung server is not worth retrying
            if attempt == max_retries or (isinstance(e, RequestFailed) and not e.retryable):
                raise
            log.warning(
                "prompt %s: attempt %d failed (%s: %s); retrying in %.0f s",
                pid, attempt + 1, type(e).__name__, e, delay,
            )  # fmt: skip
            await asyncio.sleep(delay * (1 + random.random() * 0.1))
            delay = min(delay * 2, 60)
    raise AssertionError("unreachable")


# The tokens that open tool calls in the templates eaglenest knows: Kimi's, Qwen's and Hermes',
# DeepSeek's, Mistral's, Llama's python tag and gpt-oss's recipient. In an answer's text they mean
# that no parser turned its calls into tool_calls.
TOOL_CALL_MARKERS = (
    "<|tool_calls_section_begin|>",
    "<|tool_call_begin|>",
    "<tool_call>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>",
    "[TOOL_CALLS]",
    "<|python_tag|>",
    "to=functions.",
)
TOOL_MARKUP = re.compile("|".join(re.escape(m) for m in TOOL_CALL_MARKERS))

DEFAULT_TOOL_ROUNDS = 4
# Why a tool loop stopped before the target answered without calling a tool.
CUT_REASONS = ("rounds_cap", "no_matching_result", "name_mismatch")


def request_message(message: dict) -> dict:
    """A message as a correct client sends it back to vLLM: the reasoning under `reasoning` (the
    field vLLM's server reads and hands the template as `reasoning_content` too; a
    `reasoning_content` alone is dropped), the calls with their ids and exact arguments."""
    out = {k: v for k, v in message.items() if k != "reasoning_content"}
    if message.get("reasoning_content"):
        out["reasoning"] = message["reasoning_content"]
    return out


def reply_message(message: dict) -> dict:
    """The assistant message recorded from a response message."""
    reply = {"role": "assistant", "content": message.get("content") or ""}
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        reply["reasoning_content"] = reasoning
    calls = message.get("tool_calls") or []
    if calls:
        reply["tool_calls"] = [
            {
                "id": c.get("id"),
                "type": "function",
                "function": {
                    "name": c["function"]["name"],
                    "arguments": c["function"].get("arguments") or "",
                },
            }
            for c in calls
        ]
    return reply


def results_for(calls: list[dict], recorded: dict[str, list[str]]) -> tuple[list[dict], str | None]:
    """The tool messages answering `calls` from the row's recorded results (taken by name, in
    order, so parallel calls get theirs), or the reason the loop stops there."""
    out = []
    for call in calls:
        name = call["function"]["name"]
        if name not in recorded:
            return out, "name_mismatch"
        if not recorded[name]:
            return out, "no_matching_result"
        out.append(
            # No `name`: an OpenAI client sends the call's id only (Kimi's template would label the
            # result with a name, where the served model meets none).
            {"role": "tool", "tool_call_id": call["id"], "content": recorded[name].pop(0)}
        )
    return out, None


def recorded_results(prompt: dict) -> dict[str, list[str]]:
    """A row's recorded tool results by tool name, in order: what answers its calls."""
    recorded: dict[str, list[str]] = {}
    for result in prompt.get("tool_results", ()):
        recorded.setdefault(result["name"], []).append(result["content"])
    return recorded


class RawToolMarkup(EaglenestError):
    """A tools row answered with tool-call markup in its text: the server parses no tool calls."""


async def _loop(
    post, body: dict, prompt: dict, first: dict, choice: dict, max_rounds: int, parser: str | None
):
    """Continue one sampled answer through its tool loop: every generation's served ids, the
    conversation as it went, and why it was cut (None: the target answered without a call)."""
    messages = list(prompt["messages"])
    recorded = recorded_results(prompt)
    res, generations, cut = first, [], None
    for round_ in range(max_rounds):
        if round_:
            res = await post({**body, "n": 1, "messages": [request_message(m) for m in messages]})
            choice = res["choices"][0]
        reply = reply_message(choice["message"])
        if "tools" in prompt and parser is None and TOOL_MARKUP.search(reply["content"]):
            raise RawToolMarkup(
                f"prompt {prompt['id']}: the target answered a tools row with tool-call markup in its "
                "text, which no parser turns into tool calls: set target.tool_call_parser to the "
                "vLLM --tool-call-parser of this model (e.g. kimi_k2, hermes, qwen3_xml, deepseek_v31)"
            )
        generations.append(
            {
                "messages_before": len(messages),
                "prompt_token_ids": res.get("prompt_token_ids"),
                "completion_token_ids": choice.get("token_ids"),
                "finish_reason": choice.get("finish_reason"),
            }
        )
        messages.append(reply)
        if not reply.get("tool_calls"):
            break
        if round_ == max_rounds - 1:  # no generation left to answer the results
            cut = "rounds_cap"
            break
        results, cut = results_for(reply["tool_calls"], recorded)
        if cut:
            break
        messages += results
    return {"messages": messages, "generations": generations, "cut": cut}


async def _answer(session, url: str, prompt: dict, ask: dict, max_retries: int, watch: StallWatch) -> dict:
    import aiohttp

    # Token ids too: tokenization trains on exactly what the target saw and emitted. And the
    # text exactly as emitted: vLLM's default puts spaces around added tokens (Kimi's <think>)
    # when decoding a slow tokenizer's output, text the model never wrote and that would
    # re-tokenize differently.
    mode = ask["modes"][prompt["mode"]]
    body = {
        "model": SERVED_NAME,
        "messages": [request_message(m) for m in prompt["messages"]],
        "return_token_ids": True,
        "spaces_between_special_tokens": False,
        **ask["sampling"],
        **mode["sampling"],
    }
    if mode["chat_template_kwargs"]:  # top level: vLLM reads it there, not in extra_body
        body["chat_template_kwargs"] = mode["chat_template_kwargs"]
    if "tools" in prompt:
        body["tools"] = prompt["tools"]
        body["tool_choice"] = "auto" if ask["tool_call_parser"] else "none"

    async def post(b):
        return await _post(session, url, b, prompt["id"], max_retries, watch)

    try:
        first = await post(body)
        responses = []
        for choice in first["choices"]:
            loop = await _loop(post, body, prompt, first, choice, ask["max_rounds"], ask["tool_call_parser"])
            row = {**loop, "mode": prompt["mode"], "finish_reason": loop["generations"][-1]["finish_reason"]}
            if mode["chat_template_kwargs"]:
                row["chat_template_kwargs"] = mode["chat_template_kwargs"]
            if "tools" in prompt:
                row["tools"] = prompt["tools"]
            responses.append(row)
        return {"id": prompt["id"], "responses": responses}
    except (aiohttp.ClientError, asyncio.TimeoutError, RequestFailed) as e:
        return {"id": prompt["id"], "error": f"{type(e).__name__}: {e}"}


async def _regenerate(
    server: Server,
    todo: list[dict],
    ask: dict,
    concurrency: int,
    max_retries: int,
    timeout_s: float,
    progress_file: Path,
    stall_timeout_s: float,
) -> None:
    import aiohttp

    sem = asyncio.Semaphore(concurrency)
    bar = Progress(len(todo))
    watch = StallWatch(server, stall_timeout_s)
    url = f"{server.api_url}/chat/completions"
    session = aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=timeout_s),
        headers={"Authorization": f"Bearer {server.client_key}"},
        connector=aiohttp.TCPConnector(limit=concurrency),
    )

    async def one(prompt):
        async with sem:
            return await _answer(session, url, prompt, ask, max_retries, watch)

    async with session:
        tasks = [asyncio.ensure_future(one(p)) for p in todo]
        try:
            with open(progress_file, "a") as out:
                for fut in asyncio.as_completed(tasks):
                    row = await fut
                    out.write(json.dumps(row, ensure_ascii=False) + "\n")
                    out.flush()
                    bar.step()
        finally:
            # A failed stage (hung server, full disk) stops the requests still in flight.
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def row_generations(row: dict) -> list[dict]:
    """A response row's generations (one per request of its tool loop), each with the token ids
    the server fed (`prompt_token_ids`) and the model emitted (`completion_token_ids`); rows
    written before tool loops carry one generation's ids at the top level."""
    if "generations" in row:
        return row["generations"]
    if row.get("completion_token_ids") is not None:
        return [{k: row.get(k) for k in ("prompt_token_ids", "completion_token_ids", "finish_reason")}]
    return []


def response_rows(record: dict) -> list[dict]:
    """One `raw_responses.jsonl` row per sampled response (`n` of them per prompt)."""
    pid = record["id"]
    if "error" in record:
        return [{"id": pid, "prompt_id": pid, "error": record["error"]}]
    many = len(record["responses"]) > 1
    return [
        {"id": f"{pid}:{k}" if many else pid, "prompt_id": pid, **r}
        for k, r in enumerate(record["responses"])
    ]


def _ask(sampling: dict, modes, tool_call_parser: str | None, max_tool_rounds: int) -> dict:
    modes = checked_modes(modes)
    return {
        "sampling": sampling,
        "modes": {m["name"]: m for m in modes},
        "tool_call_parser": tool_call_parser,
        "max_rounds": max_tool_rounds,
    }


def _loop_key(ask: dict) -> dict | None:
    """What the progress key adds to the sampling: nothing for the defaults (one plain mode, no
    tool parser), so a run's progress outlives this code's older versions where they agree.
    Shares decide which prompt gets which mode (prepare_prompts), never an answer: left out."""
    modes = [{k: v for k, v in m.items() if k != "share"} for m in ask["modes"].values()]
    plain = modes == [{k: v for k, v in DEFAULT_MODES[0].items() if k != "share"}]
    if plain and ask["tool_call_parser"] is None and ask["max_rounds"] == DEFAULT_TOOL_ROUNDS:
        return None
    return {"modes": modes, "parser": ask["tool_call_parser"], "rounds": ask["max_rounds"]}


@dataclass(frozen=True)
class ServerOnDemand:
    """A server started only when a prompt is to be sent: `key`, the key the started server will
    have, names the progress file before then; `start` gives the context that serves it."""

    key: str
    start: Callable[[], contextlib.AbstractContextManager[Server]]


def _started(server):
    """The server to send to: `server` itself, or a ServerOnDemand's, started now."""
    return server.start() if isinstance(server, ServerOnDemand) else contextlib.nullcontext(server)


def dataset_record(prompt: dict, ask: dict) -> dict:
    """A dataset prompt's own answer as a progress record would hold a regenerated one: the
    conversation (the prompt, then the answer), no served generations (so tokenize renders it),
    and what rides along with a regenerated answer (mode, its template switches, tools)."""
    row = {
        "messages": prompt["messages"] + prompt["answer"],
        "generations": [],
        "cut": None,
        "mode": prompt["mode"],
        "responses": DATASET,
    }
    if ask["modes"][prompt["mode"]]["chat_template_kwargs"]:
        row["chat_template_kwargs"] = ask["modes"][prompt["mode"]]["chat_template_kwargs"]
    if "tools" in prompt:
        row["tools"] = prompt["tools"]
    return {"id": prompt["id"], "responses": [row]}


def _with_modes(prompts: list[dict], modes: dict, path) -> list[dict]:
    """The prompts, each with its mode (prompts written before modes existed get the default)."""
    out = []
    for p in prompts:
        mode = p.get("mode") or DEFAULT_MODE
        if mode not in modes:
            raise EaglenestError(
                f"prompt {p['id']}: mode {mode!r} is not configured (modes: {', '.join(modes)})", path
            )
        out.append({**p, "mode": mode})
    return out


def regenerate_responses(
    server: Server,
    prompts_path,
    out_path,
    run_dir,
    *,
    target: str,
    sampling: dict,
    modes=None,
    tool_call_parser: str | None = None,
    max_tool_rounds: int = DEFAULT_TOOL_ROUNDS,
    concurrency: int = 8,
    max_retries: int = 3,
    request_timeout_s: float = 600.0,
    stall_timeout_s: float = 1800.0,
) -> dict:
    """Answer every prompt in `prompts_path` through `server` (serving `target`; a
    ServerOnDemand starts only if a prompt is left to send), each in its mode, tools rows through
    their tool loop (`max_tool_rounds` generations at most), and pass the dataset prompts' own
    answers through; write `out_path`. Returns counts."""
    ask = _ask(sampling, modes, tool_call_parser, max_tool_rounds)
    prompts = _with_modes(list(iter_jsonl(prompts_path)), ask["modes"], prompts_path)
    asked = [p for p in prompts if response_origin(p) == TARGET]
    pfile = progress_path(run_dir, server.key, sampling, target, _loop_key(ask))
    pfile.parent.mkdir(parents=True, exist_ok=True)
    done = load_progress(pfile)
    # A prompt answered in another mode (its mode's share changed) is asked again.
    todo = [p for p in asked if p["id"] not in done or _answered_mode(done[p["id"]]) != p["mode"]]
    log.info(
        "%d prompts (%d answered by their dataset), %d already answered in %s, %d to send",
        len(prompts),
        len(prompts) - len(asked),
        len(asked) - len(todo),
        pfile,
        len(todo),
    )
    needed = _room_needed(pfile, len(done), len(todo), len(prompts))
    with room_for(pfile.parent, needed, "the regenerated answers"):
        if todo:
            with _started(server) as live:
                asyncio.run(
                    _regenerate(
                        live,
                        todo,
                        ask,
                        concurrency,
                        max_retries,
                        request_timeout_s,
                        pfile,
                        stall_timeout_s,
                    )
                )
        # The last success of an id wins (an error followed by a success is a success; an answer
        # in the prompt's mode replaces one in another); an error counts only where none succeeded.
        final: dict[str, dict] = {}
        for row in _progress_records(pfile) if pfile.exists() else ():
            if "error" not in row or row["id"] not in final or "error" in final[row["id"]]:
                final[row["id"]] = row
        # The prompt's origin decides, whatever the progress holds from runs before.
        final.update((p["id"], dataset_record(p, ask)) for p in prompts if response_origin(p) == DATASET)
        check_failures(asked, final, pfile)
        write_jsonl(out_path, (row for p in prompts for row in response_rows(final[p["id"]])))
    counts = regeneration_counts(prompts, final, len(todo))
    log.info("regeneration done: %s", counts)
    return counts


def regeneration_counts(prompts: list[dict], final: dict[str, dict], sent: int) -> dict:
    """What regeneration did: prompts (those answered by their dataset among them), responses
    and generations, and every tool loop cut short, by reason."""
    responses = [r for p in prompts for r in final[p["id"]].get("responses", ())]
    failed = sum("error" in final[p["id"]] for p in prompts)
    from_dataset = sum(response_origin(p) == DATASET for p in prompts)
    return {
        "prompts": len(prompts),
        "from_dataset": from_dataset,
        "sent": sent,
        "resumed": len(prompts) - from_dataset - sent,
        "answered": len(prompts) - failed,
        "failed": failed,
        "responses": len(responses),
        "generations": sum(len(r["generations"]) for r in responses),
        "tool_loops": sum("tools" in r for r in responses),
        "cut": {reason: sum(r.get("cut") == reason for r in responses) for reason in CUT_REASONS},
    }


def check_failures(prompts: list[dict], final: dict[str, dict], progress_file) -> None:
    """Refuse a regeneration that lost most of its prompts, before its output is written (the
    answers stay in the progress file: a rerun sends only the failed prompts)."""
    failed = [p["id"] for p in prompts if "error" in final[p["id"]]]
    if prompts and len(failed) > MAX_FAILED_SHARE * len(prompts):
        raise EaglenestError(
            f"{len(failed)} of {len(prompts)} prompts failed (more than {MAX_FAILED_SHARE:.0%}); "
            f"the first, {failed[0]}: {final[failed[0]]['error']}. Fix the cause and rerun: the "
            "answered prompts are kept",
            progress_file,
        )


def regenerate_stage(
    *,
    run_dir,
    target: str,
    server_cfg: dict,
    reasoning_parser,
    tool_call_parser,
    prompts_path,
    out_path,
    sampling: dict,
    modes,
    max_tool_rounds: int,
    concurrency: int,
    max_retries: int,
    request_timeout_s: float,
) -> dict:
    """The `regenerate_responses` rule: answer every prompt, leasing the target's server only
    if some prompt is left to send."""
    check_folder_switches(modes, target, f"the target ({target})")  # before the server starts

    spec = ServerSpec(
        model=target,
        args=with_parsers(tuple(server_cfg["base_args"]), reasoning_parser, tool_call_parser),
        env=tuple(sorted(server_cfg["env"].items())),
    )
    server = ServerOnDemand(
        spec.key(),
        lambda: serving(spec, run_dir, reuse=server_cfg["reuse"], timeout_s=server_cfg["startup_timeout_s"]),
    )
    return regenerate_responses(
        server,
        prompts_path,
        out_path,
        run_dir,
        sampling=sampling,
        modes=modes,
        tool_call_parser=tool_call_parser,
        max_tool_rounds=max_tool_rounds,
        concurrency=concurrency,
        max_retries=max_retries,
        request_timeout_s=request_timeout_s,
        stall_timeout_s=server_cfg["stall_timeout_s"],
        target=target,
    )
