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
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import time
from pathlib import Path

from eaglenest.core.errors import EaglenestError
from eaglenest.core.io import iter_jsonl, room_for, write_jsonl
from eaglenest.engine.server import SERVED_NAME, Server, ServerSpec, StallWatch, serving
from eaglenest.pipeline.workflow import with_reasoning_parser

log = logging.getLogger(__name__)


# Bump when the record format changes, so a rerun does not resume from old-format answers.
RECORD_FORMAT = 4


def target_fingerprint(target: str) -> str:
    """A local target's file names, sizes and modification times (a hub id as it is)."""
    path = Path(target)
    if not path.is_dir():
        return target
    return json.dumps(
        sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in path.iterdir() if f.is_file())
    )


def progress_path(run_dir, model: str, sampling: dict, target: str) -> Path:
    spec = json.dumps(
        {"model": model, "sampling": sampling, "format": RECORD_FORMAT, "target": target_fingerprint(target)},
        sort_keys=True,
    )
    key = hashlib.sha256(spec.encode()).hexdigest()[:12]
    return Path(run_dir) / ".eaglenest" / "regenerate" / f"progress-{key}.jsonl"


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
            done[row["id"]] = row
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


async def _answer(
    session, url: str, prompt: dict, sampling: dict, max_retries: int, watch: StallWatch
) -> dict:
    import aiohttp

    # Token ids too: tokenization trains on exactly what the target saw and emitted. And the
    # text exactly as emitted: vLLM's default puts spaces around added tokens (Kimi's <think>)
    # when decoding a slow tokenizer's output, text the model never wrote and that would
    # re-tokenize differently.
    body = {
        "model": SERVED_NAME,
        "messages": prompt["messages"],
        "return_token_ids": True,
        "spaces_between_special_tokens": False,
        **sampling,
    }
    delay = 1.0
    for attempt in range(max_retries + 1):
        try:
            res = await _chat(session, url, body)
            prompt_ids = res.get("prompt_token_ids")
            responses = []
            for choice in res["choices"]:
                message = choice["message"]
                reasoning = message.get("reasoning_content") or message.get("reasoning")
                reply = {"role": "assistant", "content": message.get("content") or ""}
                if reasoning:
                    reply["reasoning_content"] = reasoning
                responses.append(
                    {
                        "messages": [*prompt["messages"], reply],
                        "finish_reason": choice.get("finish_reason"),
                        "prompt_token_ids": prompt_ids,
                        "completion_token_ids": choice.get("token_ids"),
                    }
                )
            watch.answered()
            return {"id": prompt["id"], "responses": responses}
        except (aiohttp.ClientError, asyncio.TimeoutError, RequestFailed) as e:
            watch.check(e)  # a dead or hung server is not worth retrying
            if attempt == max_retries or (isinstance(e, RequestFailed) and not e.retryable):
                return {"id": prompt["id"], "error": f"{type(e).__name__}: {e}"}
            log.warning(
                "prompt %s: attempt %d failed (%s: %s); retrying in %.0f s",
                prompt["id"], attempt + 1, type(e).__name__, e, delay,
            )  # fmt: skip
            await asyncio.sleep(delay * (1 + random.random() * 0.1))
            delay = min(delay * 2, 60)
    raise AssertionError("unreachable")


async def _regenerate(
    server: Server,
    todo: list[dict],
    sampling: dict,
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
            return await _answer(session, url, prompt, sampling, max_retries, watch)

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


def regenerate_responses(
    server: Server,
    prompts_path,
    out_path,
    run_dir,
    *,
    target: str,
    sampling: dict,
    concurrency: int = 8,
    max_retries: int = 3,
    request_timeout_s: float = 600.0,
    stall_timeout_s: float = 1800.0,
) -> dict:
    """Answer every prompt in `prompts_path` through `server` (serving `target`); write
    `out_path`. Returns counts."""
    prompts = list(iter_jsonl(prompts_path))
    pfile = progress_path(run_dir, server.key, sampling, target)
    pfile.parent.mkdir(parents=True, exist_ok=True)
    done = load_progress(pfile)
    todo = [p for p in prompts if p["id"] not in done]
    log.info(
        "%d prompts, %d already answered in %s, %d to send",
        len(prompts),
        len(prompts) - len(todo),
        pfile,
        len(todo),
    )
    needed = _room_needed(pfile, len(done), len(todo), len(prompts))
    with room_for(pfile.parent, needed, "the regenerated answers"):
        if todo:
            asyncio.run(
                _regenerate(
                    server,
                    todo,
                    sampling,
                    concurrency,
                    max_retries,
                    request_timeout_s,
                    pfile,
                    stall_timeout_s,
                )
            )
        # The last record of an id wins: an error followed by a later success is a success.
        final: dict[str, dict] = {}
        for row in _progress_records(pfile):
            if row["id"] not in final or "error" in final[row["id"]]:
                final[row["id"]] = row
        check_failures(prompts, final, pfile)
        write_jsonl(out_path, (row for p in prompts for row in response_rows(final[p["id"]])))
    failed = sum("error" in final[p["id"]] for p in prompts)
    counts = {
        "prompts": len(prompts),
        "sent": len(todo),
        "resumed": len(prompts) - len(todo),
        "answered": len(prompts) - failed,
        "failed": failed,
        "responses": sum(len(final[p["id"]].get("responses", ())) for p in prompts),
    }
    log.info("regeneration done: %s", counts)
    return counts


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
    prompts_path,
    out_path,
    sampling: dict,
    concurrency: int,
    max_retries: int,
    request_timeout_s: float,
) -> dict:
    """The `regenerate_responses` rule: lease the target's server, answer every prompt."""

    spec = ServerSpec(
        model=target,
        args=with_reasoning_parser(tuple(server_cfg["base_args"]), reasoning_parser),
        env=tuple(sorted(server_cfg["env"].items())),
    )
    with serving(
        spec, run_dir, reuse=server_cfg["reuse"], timeout_s=server_cfg["startup_timeout_s"]
    ) as server:
        return regenerate_responses(
            server,
            prompts_path,
            out_path,
            run_dir,
            sampling=sampling,
            concurrency=concurrency,
            max_retries=max_retries,
            request_timeout_s=request_timeout_s,
            stall_timeout_s=server_cfg["stall_timeout_s"],
            target=target,
        )
