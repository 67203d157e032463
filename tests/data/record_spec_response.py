"""Records chat-completion bodies as vLLM returns them with --per-request-spec-decode-metrics, for
the acceptance tests in tests/test_benchmarks.py.

    .venv/bin/python tests/data/record_spec_response.py <target folder> <scratch folder>
    .venv/bin/python tests/data/record_spec_response.py <target folder> <scratch folder> \
        --draft <draft folder> --prompts <eval_prompts.jsonl>

Without --draft it serves the target (SmolLM2-135M-Instruct as config/smollm2.yaml imports it, for
the recorded file) with n-gram speculation at k = 3 and asks MT-Bench's first question, then its
second turn ("Rewrite your previous response...", which n-gram drafts from) after the served
answer, greedy, 96 tokens each, as eaglenest's evaluation does
(eaglenest.evaluation.evaluate.generate). The second response is recorded
(vllm_chat_response_spec_metrics.json).

With --draft and --kimi-mini it serves the Kimi miniature's trained draft (a finished
`config/kimi-mini.yaml` run's `draft/` over its `target.json` path) at k = 3 with `detailed`
metrics and the kimi_k2 reasoning and tool-call parsers, asks the held-out prompts that carry
tools in thinking mode (tool_choice auto), and records the first answer whose served ids hold
reasoning and a tool call (vllm_chat_response_kimi_mini_spans.json): the spans test.

With --draft alone it serves that EAGLE-3 draft (the default run's `draft/` over its `target/`) at k = 3
with the `detailed` metrics level, which adds each verify step's accepted count, asks the
prompts greedily with the evaluation's max_tokens (256), and records the first response that
stopped at an EOS inside a verify step whose drafts vLLM had counted accepted: its kept tokens are
fewer than the prefill's one plus every step's accepted drafts and bonus token
(vllm_chat_response_stops_mid_step.json).
"""

import argparse
import json
from pathlib import Path

from eaglenest.core.io import read_jsonl
from eaglenest.data.benchmarks import read_benchmark, turn_messages
from eaglenest.engine.server import SERVED_NAME, serving
from eaglenest.evaluation.methods import method_spec

HERE = Path(__file__).resolve().parent
ENV = (("VLLM_CPU_KVCACHE_SPACE", "1"),)


def ask(client, messages, max_tokens):
    return client.chat.completions.create(
        model=SERVED_NAME,
        messages=messages,
        max_tokens=max_tokens,
        temperature=0.0,
        extra_body={"return_token_ids": True},
    ).model_dump()


def record_ngram(target: Path, scratch: Path) -> dict:
    base = ("--dtype", "bfloat16", "--max-model-len", "2048", "--enforce-eager")
    spec = method_spec("ngram", str(target), base, ENV, k=3)
    first = read_benchmark({"name": "mt_bench", "type": "mt_bench"}, seed=0, sample=False)[0]
    with serving(spec, scratch, reuse=False, timeout_s=1200) as server:
        import openai

        client = openai.OpenAI(base_url=server.api_url, api_key=server.client_key)
        answers = []
        for turn in range(2):
            response = ask(client, turn_messages(first, turn, answers), 96)
            answers.append(response["choices"][0]["message"]["content"])
    return response


def stopped_mid_step(response: dict) -> bool:
    spec = response["metrics"]["speculative_decoding"]
    produced = 1 + sum(a + 1 for a in spec["per_step_accepted"])
    return (
        response["choices"][0]["finish_reason"] == "stop"
        and produced > response["usage"]["completion_tokens"]
    )


def record_mid_step_stop(target: Path, scratch: Path, draft: Path, prompts: Path) -> dict:
    base = ("--dtype", "float32", "--max-model-len", "1024", "--enforce-eager")
    spec = method_spec("draft", str(target), base, ENV, k=3, draft_dir=draft)
    with serving(spec, scratch, reuse=False, timeout_s=1200) as server:
        import openai

        client = openai.OpenAI(base_url=server.api_url, api_key=server.client_key)
        for prompt in read_jsonl(prompts):
            response = ask(client, prompt["messages"], 256)
            if stopped_mid_step(response):
                return response
    raise SystemExit("no response stopped inside a verify step")


KIMI_MINI_ARGS = (
    "--dtype", "float32", "--max-model-len", "1024", "--enforce-eager", "--trust-remote-code",
    "--attention-backend", "CPU_MLA", "--reasoning-parser", "kimi_k2",
    "--enable-auto-tool-choice", "--tool-call-parser", "kimi_k2",
)  # fmt: skip
KIMI_MINI_ENV = (("VLLM_CPU_KVCACHE_SPACE", "1"), ("VLLM_ENABLE_V1_MULTIPROCESSING", "0"))


def spans_of(response: dict, think_close: int, markers: set[int]) -> set[str]:
    ids = response["choices"][0]["token_ids"]
    spans = {"answer"}
    if think_close in ids:
        spans.add("reasoning")
    if markers & set(ids):
        spans.add("tool_call")
    return spans


def record_kimi_mini_spans(target: Path, scratch: Path, draft: Path, prompts: Path) -> dict:
    """The first held-out answer of the miniature's trained draft, in thinking mode and with the
    row's tools (tool_choice auto), whose served ids hold reasoning and a tool call."""
    from transformers import AutoTokenizer

    from eaglenest.data.regenerate import TOOL_CALL_MARKERS

    tok = AutoTokenizer.from_pretrained(target, trust_remote_code=True)
    think_close = tok.convert_tokens_to_ids("</think>")
    markers = {i for t, i in tok.get_added_vocab().items() if t in TOOL_CALL_MARKERS}
    spec = method_spec("draft", str(target), KIMI_MINI_ARGS, KIMI_MINI_ENV, k=3, draft_dir=draft)
    with serving(spec, scratch, reuse=False, timeout_s=1200) as server:
        import openai

        client = openai.OpenAI(base_url=server.api_url, api_key=server.client_key)
        for prompt in read_jsonl(prompts):
            if not prompt.get("tools"):
                continue
            response = client.chat.completions.create(
                model=SERVED_NAME, messages=prompt["messages"], max_tokens=192, temperature=0.0,
                extra_body={"return_token_ids": True, "tools": prompt["tools"], "tool_choice": "auto"},
            ).model_dump()  # fmt: skip
            if {"reasoning", "tool_call"} <= spans_of(response, think_close, markers):
                return response
    raise SystemExit("no held-out tools answer held both reasoning and a tool call")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target", type=Path)
    ap.add_argument("scratch", type=Path)
    ap.add_argument("--draft", type=Path, help="an EAGLE-3 draft folder: record a mid-step stop")
    ap.add_argument("--prompts", type=Path, help="with --draft: the prompts to ask (eval_prompts.jsonl)")
    ap.add_argument("--kimi-mini", action="store_true", help="with --draft: the miniature's spans answer")
    args = ap.parse_args()
    target, scratch = args.target.resolve(), args.scratch.resolve()
    if args.draft and args.kimi_mini:
        response = record_kimi_mini_spans(target, scratch, args.draft.resolve(), args.prompts)
        out = HERE / "vllm_chat_response_kimi_mini_spans.json"
    elif args.draft:
        response = record_mid_step_stop(target, scratch, args.draft.resolve(), args.prompts)
        out = HERE / "vllm_chat_response_stops_mid_step.json"
    else:
        response = record_ngram(target, scratch)
        out = HERE / "vllm_chat_response_spec_metrics.json"
    out.write_text(json.dumps(response, indent=1) + "\n")
    print(json.dumps(response.get("metrics"), indent=1))


if __name__ == "__main__":
    main()
