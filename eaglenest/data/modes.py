"""Serving modes: the chat-template switches a target is served with, and which prompts get each.

A model like Kimi-K2.5 is served in two modes: thinking (its default) and instant
(``chat_template_kwargs: {thinking: false}``), each with its own sampling. A draft trained in one
mode can collapse in the other, so the training prompts are split between the configured modes
and every request, render and row carries its mode.

A mode (the config's ``modes`` list) is::

    {name: instant, chat_template_kwargs: {thinking: false}, sampling: {temperature: 0.6}, share: 0.5}

- ``chat_template_kwargs`` are sent as the top-level field of every chat request (vLLM ignores
  them inside ``extra_body`` of a raw request) and passed to the tokenizer's
  ``apply_chat_template`` when tokenize renders the row;
- ``sampling`` overrides the stage's own sampling keys for the mode's requests;
- ``share`` is the mode's part of the prompts that name no mode themselves (shares are
  normalised; a row's own ``mode`` field wins).

Templates read their switches under different names (Kimi-K2.5 and DeepSeek-V3.1 ``thinking``,
Qwen3 ``enable_thinking``, gpt-oss ``reasoning_effort``), and a switch the template never reads
changes nothing, silently. So every key is checked against the variables the template reads
(`template_switches`) and a key it never reads is refused, naming the ones it does.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from eaglenest.core.errors import EaglenestError

DEFAULT_MODE = "default"
DEFAULT_MODES = ({"name": DEFAULT_MODE, "chat_template_kwargs": {}, "sampling": {}, "share": 1.0},)
MODE_KEYS = {"name", "chat_template_kwargs", "sampling", "share"}
# Sampling keys a mode may override (the OpenAI chat fields vLLM reads).
SAMPLING_KEYS = {
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_tokens",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
}
# Variables every template may read that are not switches: the conversation and the tokenizer's
# own values, Jinja helpers transformers provides.
_NOT_SWITCHES = {
    "messages",
    "tools",
    "documents",
    "add_generation_prompt",
    "continue_final_message",
    "bos_token",
    "eos_token",
    "pad_token",
    "unk_token",
    "raise_exception",
    "strftime_now",
    "range",
    "namespace",
    "loop",
    "dict",
    "none",
    "true",
    "false",
}


def checked_modes(modes) -> list[dict]:
    """The config's modes with defaults filled in; refuses a malformed list."""
    if modes is None:
        return [dict(m) for m in DEFAULT_MODES]
    if not isinstance(modes, (list, tuple)) or not modes:
        raise EaglenestError("modes: must be a non-empty list of modes")
    out = []
    for i, mode in enumerate(modes):
        where = f"modes[{i}]"
        if not isinstance(mode, dict) or not isinstance(mode.get("name"), str) or not mode["name"]:
            raise EaglenestError(f"{where}: needs a non-empty string 'name'")
        where = f"mode '{mode['name']}'"
        extra = set(mode) - MODE_KEYS
        if extra:
            raise EaglenestError(f"{where}: unknown key(s) {', '.join(sorted(extra))}")
        kwargs = mode.get("chat_template_kwargs") or {}
        sampling = mode.get("sampling") or {}
        if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
            raise EaglenestError(f"{where}: chat_template_kwargs must be a mapping")
        if not isinstance(sampling, dict) or set(sampling) - SAMPLING_KEYS:
            bad = sorted(set(sampling) - SAMPLING_KEYS) if isinstance(sampling, dict) else sampling
            raise EaglenestError(f"{where}: sampling may set {', '.join(sorted(SAMPLING_KEYS))}; got {bad}")
        share = mode.get("share", 1.0)
        if isinstance(share, bool) or not isinstance(share, (int, float)) or share < 0:
            raise EaglenestError(f"{where}: share must be a non-negative number, got {share!r}")
        out.append(
            {"name": mode["name"], "chat_template_kwargs": kwargs, "sampling": sampling, "share": share}
        )
    names = [m["name"] for m in out]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise EaglenestError(f"modes: names must be unique, repeated: {', '.join(repeated)}")
    if not sum(m["share"] for m in out) > 0:
        raise EaglenestError("modes: at least one mode needs a positive share")
    return out


def assign_mode(row_id: str, modes: list[dict], seed: int) -> str:
    """The mode of a row that names none: drawn by the shares from a hash of its id and the seed,
    so a row keeps its mode when other rows are added or removed."""
    digest = hashlib.sha256(f"{seed}/mode/{row_id}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    total = sum(m["share"] for m in modes)
    at = 0.0
    for mode in modes:
        at += mode["share"] / total
        if u < at and mode["share"] > 0:
            return mode["name"]
    return next(m["name"] for m in reversed(modes) if m["share"] > 0)


def template_switches(template: str) -> set[str]:
    """The variables a Jinja chat template reads from outside (its switches), less the
    conversation and the tokenizer's values every template gets.

    Jinja reports a variable the template sets in one branch and reads in another as read from
    outside too; such a name counts as a switch only where the template asks whether it is
    defined (DeepSeek-V3.1's ``{% if not thinking is defined %}{% set thinking = false %}``)."""
    from jinja2 import meta, nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"])
    try:
        ast = env.parse(template)
    except Exception as e:  # a template transformers cannot render either
        raise EaglenestError(f"the chat template does not parse: {e}") from None
    outside = meta.find_undeclared_variables(ast) - _NOT_SWITCHES
    assigned = {n.name for n in ast.find_all(nodes.Name) if n.ctx in ("store", "param")}
    tested = {
        t.node.name
        for t in ast.find_all(nodes.Test)
        if t.name == "defined" and isinstance(t.node, nodes.Name)
    }
    return {v for v in outside if v not in assigned or v in tested}


def check_switches(modes: list[dict], template: str, template_name: str) -> None:
    """Refuse a mode whose chat_template_kwargs name a key the template never reads."""
    reads = template_switches(template)
    for mode in modes:
        unread = sorted(set(mode["chat_template_kwargs"]) - reads)
        if unread:
            raise EaglenestError(
                f"mode '{mode['name']}': chat_template_kwargs {', '.join(unread)}: the chat template "
                f"of {template_name} never reads {'it' if len(unread) == 1 else 'them'}, so the mode "
                "would render exactly as the default one; the switches it reads: "
                f"{', '.join(sorted(reads)) or 'none'}"
            )


def template_in_folder(folder) -> str | None:
    """The default chat template a model folder ships (``chat_template.jinja``, or the
    ``chat_template`` of ``tokenizer_config.json``), read from its files; None where it has none."""
    folder = Path(folder)
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    config = folder / "tokenizer_config.json"
    if not config.is_file():
        return None
    template = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    return template if isinstance(template, str) else None


def check_folder_switches(modes, folder, where: str) -> None:
    """`check_switches` against the template a model folder ships, where it ships one."""
    template = template_in_folder(folder)
    if template is not None:
        check_switches(checked_modes(modes), template, where)
