"""Regeneration through tool loops: a tools row's calls are answered from its recorded results and
sent back the way vLLM's server reads them, every generation's ids are kept, and a loop that cannot
go on is cut with its reason. Against a scripted OpenAI-style server running in this process."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from eaglenest.core.errors import EaglenestError
from eaglenest.data.regenerate import regenerate_responses
from eaglenest.engine.server import Server

WEATHER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
# Different spacing on purpose: the arguments must go back exactly as the server wrote them.
PARIS_ARGS = '{"city": "Paris"}'
ROME_ARGS = '{"city":"Rome"}'


def call(name: str, arguments: str, k: int) -> dict:
    return {
        "id": f"functions.{name}:{k}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def answer(content, *, calls=None, reasoning=None, prompt_ids=(1, 2, 3), token_ids=(4, 5)) -> dict:
    """A chat completion as vLLM returns it with return_token_ids."""
    message = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return {
        "id": "x",
        "object": "chat.completion",
        "model": "target",
        "prompt_token_ids": list(prompt_ids),
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if calls else "stop",
                "token_ids": list(token_ids),
            }
        ],
    }


def rounds(body: dict) -> int:
    """How many assistant turns the request carries beyond its prompt (its loop round)."""
    return sum(m["role"] == "assistant" for m in body["messages"])


def asks(body: dict) -> str:
    return body["messages"][0]["content"]


@contextlib.contextmanager
def fake_server(tmp_path, script):
    """A server in a thread of this process (so the stall watch finds its pid alive) that records
    every request body and answers `script(body)`."""
    seen: list[dict] = []
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                seen.append(body)
            data = json.dumps(script(body)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    log = tmp_path / "fake-server.log"
    log.write_text("the fake server's log\n")
    try:
        yield (
            Server(pid=os.getpid(), port=httpd.server_address[1], key="fake", log_path=str(log)),
            seen,
        )
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def write_prompts(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_rows(path) -> dict[str, dict]:
    return {r["id"]: r for r in map(json.loads, path.read_text().splitlines())}


def run(server, tmp_path, rows, name="prompts.jsonl", **kw):
    kw = {
        "target": "org/model",
        "sampling": {"temperature": 1.0, "max_tokens": 64},
        "concurrency": 2,
        "max_retries": 0,
        "request_timeout_s": 30.0,
        "stall_timeout_s": 60.0,
        **kw,
    }
    out = tmp_path / "raw_responses.jsonl"
    counts = regenerate_responses(server, write_prompts(tmp_path / name, rows), out, tmp_path / "run", **kw)
    return counts, read_rows(out)


INSTANT = [
    {"name": "thinking", "chat_template_kwargs": {"thinking": True}},
    {"name": "instant", "chat_template_kwargs": {"thinking": False}, "sampling": {"temperature": 0.6}},
]


def test_a_two_round_loop_sends_the_parallel_calls_back_with_their_recorded_results(tmp_path):
    row = {
        "id": "w",
        "mode": "instant",
        "messages": [{"role": "user", "content": "weather in Paris and Rome?"}],
        "tools": WEATHER_TOOLS,
        # Taken by name, in order: a result of another tool between the two changes nothing.
        "tool_results": [
            {"name": "get_weather", "content": "Paris: 18C, sunny"},
            {"name": "get_news", "content": "not asked for"},
            {"name": "get_weather", "content": "Rome: 21C, rain"},
        ],
    }

    def script(body):
        if rounds(body) == 0:
            calls = [call("get_weather", PARIS_ARGS, 0), call("get_weather", ROME_ARGS, 1)]
            return answer(None, calls=calls, reasoning="check both")
        return answer("Sunny in Paris, rain in Rome.", prompt_ids=[1, 2, 3, 4, 5, 6, 7], token_ids=[8, 9])

    with fake_server(tmp_path, script) as (server, seen):
        counts, out = run(server, tmp_path, [row], modes=INSTANT, tool_call_parser="kimi_k2")

    assert len(seen) == 2
    first, second = seen
    for body in seen:
        # The mode's switches at the top level (vLLM ignores them in extra_body), its sampling
        # over the stage's, and the tools with the parser's automatic choice.
        assert body["chat_template_kwargs"] == {"thinking": False}
        assert "extra_body" not in body
        assert body["temperature"] == 0.6 and body["max_tokens"] == 64
        assert body["tools"] == WEATHER_TOOLS and body["tool_choice"] == "auto"
        assert body["return_token_ids"] is True
    assert first["messages"] == row["messages"]

    sent = second["messages"]
    assert sent[0] == row["messages"][0] and len(sent) == 4
    assistant = sent[1]
    assert assistant["role"] == "assistant" and assistant["content"] in ("", None)
    assert assistant["reasoning"] == "check both"  # the field vLLM's server reads
    assert "reasoning_content" not in assistant  # which it would drop
    assert [
        (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in assistant["tool_calls"]
    ] == [
        ("functions.get_weather:0", "get_weather", PARIS_ARGS),
        ("functions.get_weather:1", "get_weather", ROME_ARGS),
    ]
    assert [(m["role"], m["tool_call_id"], m["content"]) for m in sent[2:]] == [
        ("tool", "functions.get_weather:0", "Paris: 18C, sunny"),
        ("tool", "functions.get_weather:1", "Rome: 21C, rain"),
    ]

    got = out["w"]
    assert got["cut"] is None and got["mode"] == "instant" and got["finish_reason"] == "stop"
    assert got["chat_template_kwargs"] == {"thinking": False} and got["tools"] == WEATHER_TOOLS
    assert got["messages"][:4] == [
        {k: v for k, v in m.items() if k != "reasoning"}
        | ({"reasoning_content": "check both"} if i == 1 else {})
        for i, m in enumerate(sent)
    ]
    assert got["messages"][4] == {"role": "assistant", "content": "Sunny in Paris, rain in Rome."}
    assert got["generations"] == [
        {
            "messages_before": 1,
            "prompt_token_ids": [1, 2, 3],
            "completion_token_ids": [4, 5],
            "finish_reason": "tool_calls",
        },
        {
            "messages_before": 4,
            "prompt_token_ids": [1, 2, 3, 4, 5, 6, 7],
            "completion_token_ids": [8, 9],
            "finish_reason": "stop",
        },
    ]
    assert counts["generations"] == 2 and counts["tool_loops"] == 1
    assert counts["cut"] == {"rounds_cap": 0, "no_matching_result": 0, "name_mismatch": 0}


def test_loops_that_cannot_go_on_are_cut_with_their_reason(tmp_path):
    user = lambda text: [{"role": "user", "content": text}]  # noqa: E731
    weather = [{"name": "get_weather", "content": f"weather {i}"} for i in range(5)]
    rows = [
        # Calls a function the row recorded no result for.
        {"id": "mismatch", "messages": user("mismatch"), "tools": WEATHER_TOOLS, "tool_results": weather[:1]},
        # Two calls, then a third to the same function with only two recorded.
        {"id": "third", "messages": user("third"), "tools": WEATHER_TOOLS, "tool_results": weather[:2]},
        # Calls every time, with results to spare: stopped by the cap.
        {"id": "always", "messages": user("always"), "tools": WEATHER_TOOLS, "tool_results": weather},
        {"id": "plain", "messages": user("plain")},
    ]

    def script(body):
        n = rounds(body)
        if asks(body) == "mismatch":
            return answer(None, calls=[call("get_time", '{"tz": "UTC"}', 0)])
        if asks(body) == "third":
            if n == 0:
                return answer(
                    None, calls=[call("get_weather", PARIS_ARGS, 0), call("get_weather", ROME_ARGS, 1)]
                )
            return answer(None, calls=[call("get_weather", '{"city": "Oslo"}', 2)])
        if asks(body) == "always":
            return answer(None, calls=[call("get_weather", PARIS_ARGS, n)])
        return answer("hello")

    with fake_server(tmp_path, script) as (server, seen):
        counts, out = run(server, tmp_path, rows, tool_call_parser="kimi_k2", max_tool_rounds=3)

    assert out["mismatch"]["cut"] == "name_mismatch"
    assert len(out["mismatch"]["generations"]) == 1
    assert out["mismatch"]["messages"][-1]["tool_calls"][0]["function"]["name"] == "get_time"

    assert out["third"]["cut"] == "no_matching_result"
    assert len(out["third"]["generations"]) == 2
    assert [m["content"] for m in out["third"]["messages"] if m["role"] == "tool"] == [
        "weather 0",
        "weather 1",
    ]

    assert out["always"]["cut"] == "rounds_cap"
    assert len(out["always"]["generations"]) == 3  # max_tool_rounds generations, no more
    assert sum(asks(b) == "always" for b in seen) == 3
    # The last call gets no results: no generation is left to answer them, and the row ends
    # on the target's own turn (what tokenize trains on).
    assert [m["content"] for m in out["always"]["messages"] if m["role"] == "tool"] == [
        "weather 0",
        "weather 1",
    ]
    assert out["always"]["messages"][-1]["role"] == "assistant"

    assert out["plain"]["cut"] is None and "tools" not in out["plain"]
    assert counts["cut"] == {"rounds_cap": 1, "no_matching_result": 1, "name_mismatch": 1}
    assert counts["tool_loops"] == 3
    assert counts["generations"] == 1 + 2 + 3 + 1 == len(seen)


@pytest.mark.parametrize(
    "markup",
    [
        '<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>',
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    ],
)
def test_tool_markup_in_the_text_without_a_parser_fails_naming_the_setting(tmp_path, markup):
    row = {
        "id": "w",
        "messages": [{"role": "user", "content": "weather?"}],
        "tools": WEATHER_TOOLS,
        "tool_results": [{"name": "get_weather", "content": "sunny"}],
    }
    with (
        fake_server(tmp_path, lambda body: answer(markup)) as (server, seen),
        pytest.raises(EaglenestError, match=r"target\.tool_call_parser"),
    ):
        run(server, tmp_path, [row], tool_call_parser=None)
    assert len(seen) == 1
    assert seen[0]["tool_choice"] == "none" and seen[0]["tools"] == WEATHER_TOOLS
    assert not (tmp_path / "raw_responses.jsonl").exists()


def test_the_same_markup_in_a_row_without_tools_is_kept_as_text(tmp_path):
    text = "Kimi marks calls with <|tool_calls_section_begin|>."
    row = {"id": "p", "messages": [{"role": "user", "content": "how does Kimi mark calls?"}]}
    with fake_server(tmp_path, lambda body: answer(text)) as (server, _):
        _, out = run(server, tmp_path, [row], tool_call_parser=None)
    assert out["p"]["messages"][-1]["content"] == text


def test_a_plain_row_in_the_default_mode_sends_no_switches_and_no_tools(tmp_path):
    row = {"id": "p", "messages": [{"role": "user", "content": "hi"}]}
    with fake_server(tmp_path, lambda body: answer("hello", reasoning="greet")) as (server, seen):
        counts, out = run(server, tmp_path, [row])
    (body,) = seen
    assert "chat_template_kwargs" not in body
    assert "tools" not in body and "tool_choice" not in body
    assert body["temperature"] == 1.0 and body["messages"] == row["messages"]
    got = out["p"]
    assert got["mode"] == "default" and got["cut"] is None
    assert "chat_template_kwargs" not in got and "tools" not in got
    assert got["messages"] == [
        *row["messages"],
        {"role": "assistant", "content": "hello", "reasoning_content": "greet"},
    ]
    assert got["generations"] == [
        {
            "messages_before": 1,
            "prompt_token_ids": [1, 2, 3],
            "completion_token_ids": [4, 5],
            "finish_reason": "stop",
        }
    ]
    assert counts["generations"] == 1 and counts["tool_loops"] == 0
    assert counts["cut"] == {"rounds_cap": 0, "no_matching_result": 0, "name_mismatch": 0}


def test_a_rerun_with_one_more_prompt_sends_only_that_prompt(tmp_path):
    def row(i):
        return {
            "id": f"w{i}",
            "mode": "instant",
            "messages": [{"role": "user", "content": f"weather {i}?"}],
            "tools": WEATHER_TOOLS,
            "tool_results": [{"name": "get_weather", "content": f"sunny {i}"}],
        }

    def script(body):
        if rounds(body) == 0:
            return answer(None, calls=[call("get_weather", PARIS_ARGS, 0)])
        return answer("sunny")

    kw = {"modes": INSTANT, "tool_call_parser": "kimi_k2"}
    with fake_server(tmp_path, script) as (server, seen):
        counts, _ = run(server, tmp_path, [row(0), row(1)], **kw)
        assert len(seen) == 4 and counts["sent"] == 2
        seen.clear()
        counts, out = run(server, tmp_path, [row(0), row(1), row(2)], **kw)
    assert len(seen) == 2  # the new prompt's two generations, nothing else
    assert {asks(b) for b in seen} == {"weather 2?"}
    assert (counts["sent"], counts["resumed"], counts["answered"]) == (1, 2, 3)
    assert counts["generations"] == 6 and counts["tool_loops"] == 3
    assert list(out) == ["w0", "w1", "w2"]
    assert all(r["cut"] is None and len(r["generations"]) == 2 for r in out.values())


def test_a_prompt_whose_mode_changed_is_asked_again_in_its_new_mode(tmp_path):
    """A share edited in the config moves some prompts to another mode: a rerun asks those
    again (with the new switch) and keeps the others' answers."""
    modes = [{"name": "thinking"}, {"name": "instant", "chat_template_kwargs": {"thinking": False}}]

    def row(i, mode):
        return {"id": f"p{i}", "mode": mode, "messages": [{"role": "user", "content": f"q{i}?"}]}

    with fake_server(tmp_path, lambda body: answer("ok")) as (server, seen):
        run(server, tmp_path, [row(0, "thinking"), row(1, "thinking")], modes=modes)
        seen.clear()
        counts, out = run(server, tmp_path, [row(0, "thinking"), row(1, "instant")], modes=modes)
    assert [asks(b) for b in seen] == ["q1?"]
    assert seen[0]["chat_template_kwargs"] == {"thinking": False}
    assert (counts["sent"], counts["resumed"]) == (1, 1)
    assert (out["p0"]["mode"], out["p1"]["mode"]) == ("thinking", "instant")


def test_evaluation_replays_a_held_out_tool_loop_round_by_round(tmp_path):
    """A held-out prompt with recorded tool results is asked as a loop: the reference (no_spec)
    calls, gets the recorded result, answers; every other method is asked the very same rounds,
    the reference's calls sent back with their ids and exact argument strings and its reasoning
    under `reasoning`. Each round is a request of the tool_loop class. A loop whose call has no
    recorded result stops there, for every method alike."""
    from eaglenest.evaluation.asking import ask_conversations, held_out_conversations, in_mode

    def script(body):
        if "add_generation_prompt" in body:  # the /tokenize room check
            return {"count": 5, "max_model_len": 100}
        if rounds(body) == 0:
            name = "get_time" if "time" in asks(body) else "get_weather"
            message = answer("", calls=[call(name, '{"tz":  "UTC"}', 0)], reasoning="Need the clock.")
        else:
            message = answer("It is noon.")
        return {**message, "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}

    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    rows = [
        {"id": "t", "messages": [{"role": "user", "content": "What time is it?"}], "tools": tools,
         "tool_results": [{"name": "get_time", "content": "12:00"}]},
        {"id": "w", "messages": [{"role": "user", "content": "Weather?"}], "tools": tools,
         "tool_results": [{"name": "get_time", "content": "12:00"}]},
    ]  # fmt: skip
    path = tmp_path / "eval_prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    conversations = in_mode(
        held_out_conversations(path, max_tool_rounds=3), {"name": "default", "chat_template_kwargs": {}}
    )
    gen = {"max_tokens": 4, "concurrency": 1, "stall_timeout_s": 30}
    answers: dict = {}
    with fake_server(tmp_path, script) as (server, seen):
        reference, _, _ = ask_conversations(server, conversations, answers, is_reference=True, **gen)
        asked_reference = [b for b in seen if "add_generation_prompt" not in b]
        seen.clear()
        draft, _, _ = ask_conversations(server, conversations, answers, is_reference=False, **gen)
        asked_draft = [b for b in seen if "add_generation_prompt" not in b]
    assert [(o["id"], o["turn"], o["traffic"]) for o in reference] == [
        ("t", 0, "tool_loop"), ("w", 0, "tool_loop"), ("t", 1, "tool_loop")
    ]  # fmt: skip
    assert [(o["id"], o["turn"]) for o in draft] == [(o["id"], o["turn"]) for o in reference]
    assert asked_draft == asked_reference
    second = asked_reference[-1]
    assert second["tool_choice"] == "auto" and second["tools"] == tools
    assistant, result = second["messages"][1:]
    assert assistant["tool_calls"][0]["function"]["arguments"] == '{"tz":  "UTC"}'
    assert assistant["reasoning"] == "Need the clock." and "reasoning_content" not in assistant
    assert result == {"role": "tool", "tool_call_id": assistant["tool_calls"][0]["id"], "content": "12:00"}
