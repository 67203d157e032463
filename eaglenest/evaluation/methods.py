"""The ways evaluation serves the target: no speculation, the model-free baselines, and the drafts.

Every method runs on its own vLLM server with the same `num_speculative_tokens` (k):

- ``no_spec``: plain decoding, the reference every method's greedy outputs must equal;
- ``ngram``: vLLM's prompt lookup, the baseline every user has without training anything;
- ``suffix``: vLLM's suffix decoding (SuffixDecoding, NeurIPS 2025), model-free like n-gram but
  drawing on a tree of earlier responses as well as the prompt; it needs the `arctic-inference`
  package, so it is asked for in `evaluate.baselines` and refused at planning where the package
  is missing (`check_baselines`);
- ``untrained_draft``: the trained draft's shape with fresh weights, the floor;
- ``draft``: the trained draft.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
from pathlib import Path

from eaglenest.core.errors import EaglenestError
from eaglenest.draft.algorithms import folder_algorithm, vllm_speculative_config
from eaglenest.engine.server import ServerSpec, serving

BASELINES = ("ngram", "suffix")
DRAFTS = ("untrained_draft", "draft")
METHODS = ("no_spec", "ngram", *DRAFTS)  # the default order: the reference first, the draft last


def evaluated_methods(baselines=("ngram",)) -> tuple[str, ...]:
    """The methods a run evaluates, in serving order, for the config's `evaluate.baselines`."""
    unknown = [b for b in baselines if b not in BASELINES]
    if unknown:
        raise EaglenestError(f"evaluate.baselines: unknown {unknown}; known: {', '.join(BASELINES)}")
    return ("no_spec", *dict.fromkeys(baselines), *DRAFTS)


def check_baselines(baselines) -> None:
    """Refuse, before any stage runs, a baseline whose engine code is not installed: vLLM would
    fail it only when evaluation starts its server, after hours of training."""
    if "suffix" in baselines and importlib.util.find_spec("arctic_inference") is None:
        raise EaglenestError(
            "evaluate.baselines: suffix needs the arctic-inference package (vLLM's suffix method "
            "imports its suffix tree), which is not installed in this environment; install it "
            "(docs/guide/evaluation.md#suffix-decoding) or leave suffix out"
        )


def speculative_config(method: str, k: int, *, draft_dir=None, ngram: dict | None = None) -> dict | None:
    """vLLM's `--speculative-config` for a method (None for no_spec)."""
    if method == "no_spec":
        return None
    if method == "ngram":
        ngram = ngram or {}
        return {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_min": ngram.get("prompt_lookup_min", 2),
            "prompt_lookup_max": ngram.get("prompt_lookup_max", 4),
        }
    if method == "suffix":
        # Suffix decoding sizes each proposal itself; k caps it, as it caps every other method.
        return {"method": "suffix", "num_speculative_tokens": k}
    if method in DRAFTS:
        # The served folder's own type decides how vLLM drafts with it (P-EAGLE: in parallel).
        return vllm_speculative_config(folder_algorithm(draft_dir), str(Path(draft_dir).resolve()), k)
    raise ValueError(f"unknown method {method}")


def method_spec(
    method: str,
    target: str,
    base_args: tuple,
    env: tuple,
    *,
    k: int,
    draft_dir=None,
    ngram: dict | None = None,
) -> ServerSpec:
    """The server one method is asked on."""
    args = list(base_args)
    spec = speculative_config(method, k, draft_dir=draft_dir, ngram=ngram)
    if spec is not None:
        # vLLM refuses the metrics flag without speculation. `detailed` gives each response its
        # own accepted count per verify step, in order: what places acceptance inside the
        # reasoning, answer and tool-call spans (eaglenest.evaluation.spans).
        args += ["--speculative-config", json.dumps(spec), "--per-request-spec-decode-metrics", "detailed"]
    return ServerSpec(model=target, args=tuple(args), env=env)


@contextlib.contextmanager
def method_server(method, target, server_cfg, run_dir, *, k, ngram, draft_dir):
    """One method's server (reused while its flags match)."""

    base, env = tuple(server_cfg["base_args"]), tuple(sorted(server_cfg["env"].items()))
    spec = method_spec(method, target.path, base, env, k=k, draft_dir=draft_dir, ngram=ngram)
    with serving(
        spec, run_dir, reuse=server_cfg["reuse"], timeout_s=server_cfg["startup_timeout_s"]
    ) as server:
        yield server
