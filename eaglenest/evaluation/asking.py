"""Asking a served method the evaluated sets: the held-out split and each benchmark, in each mode.

What is asked is a list of conversations: a held-out prompt is one asked once (its own messages,
its tools); a benchmark conversation is a run of user turns, turn t asked after the reference's
(no_spec's) greedy answers to the turns before it, as MT-Bench does, so every method is asked
the same prompts and its outputs compare token for token. A held-out prompt that calls tools and
recorded their results is replayed as a tool loop (traffic class `tool_loop`, where the target
has a tool-call parser): round r is the prompt, the reference's calls of the rounds before it
(ids and exact arguments, as regeneration sends them back) and the recorded results answering
them, so every method is asked each round the reference reached. Every conversation is asked in
every configured mode: the mode's template switches go at the top level of each request, where vLLM
reads them. Evaluation is greedy in every mode (a mode's sampling is its regeneration's):
losslessness is a token-for-token comparison, which sampling would void.
"""

from __future__ import annotations

import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from eaglenest.core.errors import EaglenestError
from eaglenest.core.io import iter_jsonl, read_json
from eaglenest.data.benchmarks import HELD_OUT, request_acceptance, turn_messages
from eaglenest.data.regenerate import recorded_results, reply_message, request_message, results_for
from eaglenest.engine.server import SERVED_NAME, Server, ServerError, StallWatch
from eaglenest.evaluation.figures import answer_key


def held_out_conversations(path, max_tool_rounds: int = 0) -> list[dict]:
    """The held-out prompts as conversations of one turn, each with its tools; a prompt with
    recorded tool results as a tool loop of up to `max_tool_rounds` rounds (0: none is)."""
    conversations = []
    for r in iter_jsonl(path):
        c = {"benchmark": HELD_OUT, "id": r["id"], "category": "all", "messages": r["messages"]}
        if r.get("tools"):
            c["tools"] = r["tools"]
            if max_tool_rounds and r.get("tool_results"):
                c.update(tool_results=r["tool_results"], max_rounds=max_tool_rounds)
        conversations.append(c)
    if not conversations:
        raise EaglenestError("no held-out prompts to evaluate on", path)
    return conversations


def in_mode(conversations: list[dict], mode: dict) -> list[dict]:
    """The conversations as asked in one mode: its name and its template switches on each."""
    switches = {"chat_template_kwargs": mode["chat_template_kwargs"]} if mode["chat_template_kwargs"] else {}
    return [{**c, "mode": mode["name"], **switches} for c in conversations]


def turns_of(conversation: dict) -> int:
    """How many turns a conversation has at most (a tool loop: its rounds)."""
    if "max_rounds" in conversation:
        return conversation["max_rounds"]
    return 1 if "messages" in conversation else len(conversation["turns"])


def asked_messages(conversation: dict, turn: int, answers: dict) -> list[dict] | None:
    """The chat a conversation's turn is asked with; None where the reference's tool loop
    ended before this round."""
    c = conversation
    if "max_rounds" in c:
        return loop_messages(c, turn, answers)
    if "messages" in c:
        return c["messages"]
    return turn_messages(
        c, turn, [answers[(c["benchmark"], c["mode"], c["id"], t)]["text"] for t in range(turn)]
    )


def loop_messages(c: dict, turn: int, answers: dict) -> list[dict] | None:
    """Round `turn` of a replayed tool loop: the prompt, then each earlier round's reference
    answer (its reasoning, its calls with their ids and exact arguments) and the recorded results
    answering its calls; None where the reference answered without a call, or its calls have no
    recorded result, before this round."""
    messages = list(c["messages"])
    recorded = recorded_results(c)
    for r in range(turn):
        reference = answers.get((c["benchmark"], c["mode"], c["id"], r))
        if reference is None or not reference.get("tool_calls"):
            return None
        reply = {"role": "assistant", "content": reference["text"], "tool_calls": reference["tool_calls"]}
        if reference.get("reasoning"):
            reply["reasoning_content"] = reference["reasoning"]
        results, cut = results_for(reply["tool_calls"], recorded)
        if cut:
            return None
        messages += [request_message(reply), *results]
    return messages


def request_fields(asked: dict) -> dict:
    """A request's fields besides its messages: its mode's switches, and its tools (with
    tool_choice none, the target answering, except in a replayed tool loop)."""
    fields = {}
    if asked.get("chat_template_kwargs"):
        fields["chat_template_kwargs"] = asked["chat_template_kwargs"]
    if asked.get("tools"):
        # A replayed loop lets the target call (the server parses its calls); otherwise it answers.
        fields.update(tools=asked["tools"], tool_choice="auto" if asked.get("max_rounds") else "none")
    return fields


def traffic_of(asked: dict) -> str:
    """The traffic class of a request, for the figures per class: a round of a replayed tool
    loop, a prompt answered with tools, or a chat."""
    if asked.get("max_rounds"):
        return "tool_loop"
    return "tool" if asked.get("tools") else "chat"


def response_row(prompt_id: str, response: dict) -> dict:
    """What evaluation keeps of one chat-completion response (its JSON body): the greedy text
    and token ids, the token counts, vLLM's per-request spec-decode metrics (None without
    speculation), and its calls and reasoning where the server parsed some."""
    choice = response["choices"][0]
    reply = reply_message(choice["message"])
    row = {
        "id": prompt_id,
        "text": reply["content"],
        "token_ids": choice.get("token_ids"),
        "prompt_tokens": response["usage"]["prompt_tokens"],
        "completion_tokens": response["usage"]["completion_tokens"],
        "spec": (response.get("metrics") or {}).get("speculative_decoding"),
    }
    # A tool loop's next round is asked after the reference's reasoning and calls.
    if reply.get("tool_calls"):
        row["tool_calls"] = reply["tool_calls"]
    if reply.get("reasoning_content"):
        row["reasoning"] = reply["reasoning_content"]
    return row


def generate(server: Server, prompts: list[dict], max_tokens: int, concurrency: int, stall_timeout_s: float):
    """Greedy completions (token ids and text) for every prompt; returns (outputs, seconds).
    Every prompt must be answered (the methods are compared prompt by prompt): a request that
    fails twice, or a server silent for `stall_timeout_s`, fails the stage."""

    import openai

    client = openai.OpenAI(
        base_url=server.api_url, api_key=server.client_key, max_retries=1, timeout=stall_timeout_s
    )
    watch = StallWatch(server, stall_timeout_s)

    def one(p):
        try:
            r = client.chat.completions.create(
                model=SERVED_NAME,
                messages=p["messages"],
                max_tokens=max_tokens,
                temperature=0.0,
                # The client sends extra_body's keys at the top level of the request, where vLLM
                # reads chat_template_kwargs (the prompt's mode).
                extra_body={"return_token_ids": True, "ignore_eos": False, **request_fields(p)},
            )
        except openai.APIError as e:
            watch.check(e)
            raise ServerError(f"prompt {p['id']}: the server failed it twice: {e}", server.log_path) from e
        watch.answered()
        return response_row(p["id"], r.model_dump())

    t0 = time.monotonic()
    pool = ThreadPoolExecutor(concurrency)
    try:
        outs = list(pool.map(one, prompts))
    finally:  # on a failure, fail now: queued prompts are dropped, not sent to a hung server
        pool.shutdown(wait=False, cancel_futures=True)
    return outs, time.monotonic() - t0


def check_spec_metrics(server: Server, outs: list[dict]) -> None:
    """A speculating server's every response carries its own spec-decode metrics."""
    if missing := [o["id"] for o in outs if not o["spec"]]:
        # Counted as steps of one token each, they would pull the figure down unseen.
        raise ServerError(
            f"{len(missing)} responses carry no per-request spec-decode metrics (e.g. prompt "
            f"{missing[0]}): the server needs --per-request-spec-decode-metrics",
            server.log_path,
        )


def evaluate_prompts(
    server: Server, prompts: list[dict], *, k: int, spec_decoding: bool, **gen
) -> tuple[dict, list[dict]]:
    """Every prompt answered greedily (`generate`), and the acceptance of all of them from each
    response's own spec-decode metrics (request_acceptance), with output tokens/s: for the
    benchmarks that compare servers on the held-out prompts alone."""
    outs, seconds = generate(server, prompts, **gen)
    if spec_decoding:
        check_spec_metrics(server, outs)
    result = request_acceptance(outs, k)
    result.update(
        seconds=round(seconds, 3),
        output_tokens_per_s=round(result["output_tokens"] / seconds, 2) if seconds else None,
    )
    return result, outs


def room_for_answer(server: Server, prompts: list[dict], max_tokens: int) -> list[bool]:
    """Whether each prompt, rendered by the server itself (its /tokenize endpoint, with the
    template it serves), leaves `max_tokens` within its max_model_len."""
    fits = []
    for p in prompts:
        body = json.dumps(
            {
                "model": SERVED_NAME,
                "messages": p["messages"],
                "add_generation_prompt": True,
                **request_fields(p),
            }
        )
        request = urllib.request.Request(
            f"{server.base_url}/tokenize",
            data=body.encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {server.client_key}"},
        )
        with urllib.request.urlopen(request, timeout=60) as r:
            answer = json.loads(r.read())
        fits.append(answer["count"] + max_tokens <= answer["max_model_len"])
    return fits


def _cut_too_long(outputs_path) -> set[tuple[str, str]]:
    """(set, id) of the conversations no_spec was cut from for want of room, as the evaluation
    that wrote `outputs_path` recorded them in its acceptance.json (none where there is none)."""
    acceptance = Path(outputs_path).with_name("acceptance.json")
    summary = read_json(acceptance) if acceptance.exists() else {}
    sets = {HELD_OUT: summary.get("no_spec") or {}}
    sets.update({name: b.get("no_spec") or {} for name, b in (summary.get("benchmarks") or {}).items()})
    return {
        (name, pid) for name, figures in sets.items() for pid in figures.get("conversations_cut_too_long", ())
    }


# What a request carries from its conversation besides its messages (request_fields reads them).
ASKED_FIELDS = ("tools", "chat_template_kwargs", "max_rounds")


def ask_conversations(
    server,
    conversations: list[dict],
    answers: dict,
    *,
    is_reference: bool,
    max_tokens,
    concurrency,
    stall_timeout_s,
) -> tuple[list[dict], float, list[str]]:
    """Every turn of the conversations (each carrying its `mode`), a turn of all of them at a
    time; turn t is asked after the reference's answers to the turns before it (no_spec's,
    which `is_reference` records as it goes). Returns the outputs, the seconds spent generating
    and the conversations left out for want of room."""
    outs_all, seconds, too_long = [], 0.0, []
    for turn in range(max(map(turns_of, conversations), default=0)):
        asked, prompts = [], []
        for c in conversations:
            if turns_of(c) <= turn or c["id"] in too_long:
                continue
            messages = asked_messages(c, turn, answers)
            if messages is None:  # the reference's tool loop ended before this round
                continue
            asked.append(c)
            prompts.append(
                {"id": c["id"], "messages": messages, **{f: c[f] for f in ASKED_FIELDS if c.get(f)}}
            )
        # A turn whose prompt leaves no room for its answer would fail at the server: it and
        # the conversation's later turns are left out, the same for every method.
        fit = room_for_answer(server, prompts, max_tokens)
        too_long += [c["id"] for c, ok in zip(asked, fit, strict=True) if not ok]
        asked = [c for c, ok in zip(asked, fit, strict=True) if ok]
        prompts = [p for p, ok in zip(prompts, fit, strict=True) if ok]
        if not prompts:
            break
        outs, s = generate(server, prompts, max_tokens, concurrency, stall_timeout_s)
        seconds += s
        outs = [
            {
                **o,
                "set": c["benchmark"],
                "mode": c["mode"],
                "turn": turn,
                "category": c["category"],
                "traffic": traffic_of(c),
            }
            for c, o in zip(asked, outs, strict=True)
        ]
        if is_reference:
            answers.update({answer_key(o): o for o in outs})
        outs_all += outs
    return outs_all, seconds, too_long


def reference_answers(path, conversations: list[dict]) -> dict:
    """The no_spec outputs an earlier evaluation stored, by answer_key: they must cover these
    very conversations in these modes, or losslessness would compare different questions. A
    turn of a conversation that evaluation left out for want of room (its acceptance.json,
    beside the outputs) needs none: the same room check leaves it out here."""

    if path is None:
        raise EaglenestError("an evaluation without no_spec needs the reference outputs of one with it")
    found = {answer_key(r): r for r in iter_jsonl(path) if r.get("method") == "no_spec"}
    cut = _cut_too_long(path)
    # A replayed loop's later rounds are the reference's own: asked only where it reached them.
    needed = [
        (c["benchmark"], c["mode"], c["id"], t)
        for c in conversations
        for t in range(1 if "max_rounds" in c else turns_of(c))
    ]
    missing = [key for key in needed if key not in found and (key[0], key[2]) not in cut]
    if missing:
        where, mode, pid, turn = missing[0]
        raise EaglenestError(
            f"holds no no_spec output for {len(missing)} of the {len(needed)} prompts evaluated "
            f"(first: {pid}, turn {turn + 1} of {where} in mode {mode}): it was made for other prompts",
            path,
        )
    return found
