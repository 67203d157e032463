"""config/schemas/config.schema.yaml is the one source of truth for the configuration.

It names the keys a config must have (a missing one stops the workflow at start), describes
every key, and holds the defaults the rules rely on: Snakemake's `validate` fills them in, so
the rules read `config[section][key]` without repeating them.
"""

from __future__ import annotations

import copy
import os
import re

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
import yaml
from conftest import REPO, default_config, snakemake, write_config
from snakemake.utils import validate

SCHEMA_PATH = REPO / "config" / "schemas" / "config.schema.yaml"
SCHEMA = yaml.safe_load(SCHEMA_PATH.read_text())
SHIPPED = sorted((REPO / "config").glob("*.yaml"))
EXAMPLES = sorted((REPO / "config" / "examples").glob("*.yaml"))


def properties(schema: dict, path: str = ""):
    """(dotted path, subschema) of every property, through nested objects and array items.
    An `if` only restates conditions on properties described elsewhere, so it is not walked."""
    for name, sub in schema.get("properties", {}).items():
        yield f"{path}{name}", sub
        yield from properties(sub, f"{path}{name}.")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from properties(schema[key], f"{path.rstrip('.')}[].")
    for branch in schema.get("allOf", []) + schema.get("anyOf", []) + schema.get("oneOf", []):
        for key in ("then", "else"):
            if isinstance(branch.get(key), dict):
                yield from properties(branch[key], path)


def filled(sub: dict):
    """The value validation leaves for a missing key: its default, with the defaults of the
    default's own properties filled in (evaluate.ngram: {} becomes both lookup bounds)."""
    value = copy.deepcopy(sub["default"])
    if isinstance(value, dict):
        for name, inner in sub.get("properties", {}).items():
            if "default" in inner:
                value.setdefault(name, filled(inner))
    return value


def defaulted_keys(schema: dict, path: tuple = ()):
    """Every key with a default that a config section reaches through objects alone (array items
    hold none, see the schema)."""
    for name, sub in schema.get("properties", {}).items():
        if "default" in sub:
            yield (*path, name), sub
        if sub.get("type") == "object":
            yield from defaulted_keys(sub, (*path, name))


def test_workflow_rejects_missing_required_key_at_start(tmp_path):
    cfg = default_config()
    del cfg["train"]["epochs"]
    proc = snakemake(tmp_path, write_config(tmp_path, cfg), "-n", check=False, timeout=300)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text[-2000:]
    assert "Error validating config file" in text
    assert "'epochs' is a required property" in text
    assert "schema['properties']['train']" in text  # the section it is missing from
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("configfile", SHIPPED, ids=lambda p: p.name)
def test_shipped_configs_validate_on_their_own(configfile):
    # A --configfile is the whole config (nothing of config/config.yaml under it).
    validate(yaml.safe_load(configfile.read_text()), str(SCHEMA_PATH))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_example_overlays_validate_merged_as_their_header_says(example):
    """An example under config/examples/ is merged over a shipped config: the command its header
    gives (`--configfile BASE EXAMPLE`) must validate, the way Snakemake merges the files."""
    from snakemake.utils import update_config

    text = example.read_text()
    command = re.search(r"--configfile (\S+) (\S+)", text)
    assert command and command.group(2) == f"config/examples/{example.name}", "the header names its command"
    cfg = yaml.safe_load((REPO / command.group(1)).read_text())
    update_config(cfg, yaml.safe_load(text))
    validate(cfg, str(SCHEMA_PATH))


def test_a_train_data_ratio_speculators_refuses_is_refused_at_start():
    """speculators' loader requires 0 < ratio < 1; 1 would fail only at training, hours in."""
    cfg = default_config()
    cfg["train"]["train_data_ratio"] = 1
    with pytest.raises(Exception, match="1 is greater than or equal to the maximum of 1"):
        validate(cfg, str(SCHEMA_PATH))


def test_every_property_is_described():
    props = dict(properties(SCHEMA))
    undescribed = [path for path, sub in props.items() if not str(sub.get("description", "")).strip()]
    assert not undescribed, f"schema properties without a description: {undescribed}"
    # The walk reaches nested objects and array items, so it checks more than the top level.
    for path in ("target.build_tiny.seed", "prompts.sources[].name", "evaluate.ngram.prompt_lookup_max"):
        assert path in props


def objects(schema: dict, path: str = ""):
    """(dotted path, subschema) of every object with named properties, array items included."""
    if "properties" in schema:
        yield path or "(top)", schema
    for name, sub in schema.get("properties", {}).items():
        yield from objects(sub, f"{path}{name}" if not path else f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from objects(schema["items"], f"{path}[]")


def test_every_object_lists_its_required_keys():
    sections = dict(objects(SCHEMA))
    assert sections.keys() >= {"(top)", "target", "vllm", "prompts", "prompts.sources[]", "train", "evaluate"}
    # Objects whose keys all have defaults or may be left out.
    optional = {
        "target.build_tiny",
        "evaluate.ngram",
        "sweep",
        "export",
        "draft",
        "draft.p_eagle",
        "draft.dflash",
    }
    assert [p for p, sub in sections.items() if p not in optional and not sub.get("required")] == []


@pytest.mark.parametrize(
    ("keys", "sub"),
    list(defaulted_keys(SCHEMA)),
    ids=[".".join(keys) for keys, _ in defaulted_keys(SCHEMA)],
)
def test_validation_fills_in_a_removed_default(keys, sub):
    cfg = default_config()
    section = cfg
    for key in keys[:-1]:
        section = section[key]
    section.pop(keys[-1], None)
    validate(cfg, str(SCHEMA_PATH))
    value = cfg
    for key in keys:
        value = value[key]
    assert value == filled(sub)


def test_rules_rely_on_filled_defaults():
    # The keys the rules read as config[...][...] since their defaults moved into the schema.
    relied_on = {
        ("target", "revision"),
        ("target", "cache_dir"),
        ("target", "reasoning_parser"),
        ("target", "build_tiny"),
        ("vllm", "reuse_server"),
        ("vllm", "startup_timeout_s"),
        ("prompts", "seed"),
        ("vocab", "always_keep_ids"),
        ("hidden_states", "aux_layer_ids"),
        ("hidden_states", "disk_margin_gb"),
        ("hidden_states", "concurrency"),
        ("evaluate", "ngram"),
        ("draft", "mask_token_id"),
        ("draft", "p_eagle"),
        ("draft", "dflash"),
    }
    assert relied_on <= {keys for keys, _ in defaulted_keys(SCHEMA)}
    cfg = default_config()
    del cfg["vllm"]["startup_timeout_s"], cfg["evaluate"]["ngram"]
    validate(cfg, str(SCHEMA_PATH))
    assert cfg["vllm"]["startup_timeout_s"] == 900
    assert cfg["evaluate"]["ngram"] == {"prompt_lookup_min": 2, "prompt_lookup_max": 4}


def test_build_tiny_keeps_no_defaults():
    # A default inside build_tiny crashes Snakemake's validator when build_tiny is null.
    tiny = SCHEMA["properties"]["target"]["properties"]["build_tiny"]
    assert not [name for name, sub in tiny["properties"].items() if "default" in sub]
    cfg = default_config()
    cfg["target"]["build_tiny"] = None
    validate(cfg, str(SCHEMA_PATH))
    assert cfg["target"]["build_tiny"] is None
