"""The docs stay honest: generated pages current, a strict site build, every schema key in the
reference and every documented key in the schema, docs paths in code that exist, a README of one
screen without dates or measured figures, and records that say when, where and how."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
sys.path.insert(0, str(DOCS))
import generate  # noqa: E402 -- docs/generate.py, the pages' generator

README_CAP = 150
# Pages written by docs/generate.py: their figures come from records, their keys from the schema.
GENERATED_PAGES = {generate.CONFIG_PAGE, generate.RESULTS_PAGE}
# A date, or a number with a unit of time, size, speed or share: what a measurement looks like.
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
MEASURED = re.compile(
    r"\b\d[\d,.]*\s*(?:s|ms|sec|seconds?|min|minutes?|hours?|[KMGT]i?B|tok/s|tokens/s|%|x faster)(?![\w-])"
)
# `target.json` names a file, not the key `json` of `target`.
FILE_SUFFIXES = {"json", "jsonl", "yaml", "yml", "md", "py", "csv", "png", "pt", "npy", "tsv", "txt", "log"}
DOCS_PATH = re.compile(r"\bdocs/[\w./-]+\.md(?:#[\w-]+)?")


def hand_written_pages() -> list[Path]:
    return [p for p in DOCS.rglob("*.md") if p not in GENERATED_PAGES and "_moved" not in p.parts]


def schema_keys(schema: dict) -> set[str]:
    return {k["key"].replace("[]", "") for k in generate.schema_keys(schema)}


def documented_keys(text: str, tops: set[str]) -> set[str]:
    """Config keys a page names in code spans: dotted names under a top-level schema key."""
    spans = re.findall(r"`([a-z_]+(?:\.[a-z_0-9]+)+)`", text)
    return {s for s in spans if s.split(".")[0] in tops and s.rsplit(".", 1)[1] not in FILE_SUFFIXES}


def heading_slugs(page: Path) -> set[str]:
    """The anchors mkdocs (and GitHub) give a page's headings."""
    slugs = set()
    for line in page.read_text().splitlines():
        if m := re.match(r"^#{1,6}\s+(.*)$", line):
            text = re.sub(r"[^\w\s-]", "", m.group(1).replace("`", "")).strip().lower()
            slugs.add(re.sub(r"\s+", "-", text))
    return slugs


def test_generated_pages_are_current():
    assert generate.main(["--check"]) == 0, "run `make docs` and commit the pages"


def test_every_schema_key_is_in_the_reference_and_every_documented_key_in_the_schema():
    schema = yaml.safe_load(generate.SCHEMA.read_text())
    keys = schema_keys(schema)
    reference = generate.CONFIG_PAGE.read_text()
    assert not [k for k in generate.schema_keys(schema) if f"`{k['key']}`" not in reference]
    tops = set(schema["properties"])
    for page in [*hand_written_pages(), REPO / "README.md"]:
        unknown = sorted(documented_keys(page.read_text(), tops) - keys)
        assert not unknown, f"{page.relative_to(REPO)} names keys the schema lacks: {unknown}"


def test_a_renamed_schema_key_fails_the_docs_checks(tmp_path, monkeypatch):
    """Renaming a key in the schema alone: the reference is stale, and the pages that name the
    old key name one the schema no longer has."""
    schema = generate.SCHEMA.read_text()
    assert "disk_margin_gb:" in schema
    renamed = tmp_path / "config.schema.yaml"
    renamed.write_text(schema.replace("disk_margin_gb:", "free_disk_margin_gb:"))
    monkeypatch.setattr(generate, "SCHEMA", renamed)
    assert generate.main(["--check"]) == 1
    keys = schema_keys(yaml.safe_load(renamed.read_text()))
    tops = set(yaml.safe_load(renamed.read_text())["properties"])
    named = set().union(*(documented_keys(p.read_text(), tops) for p in hand_written_pages()))
    assert "hidden_states.disk_margin_gb" in named - keys


def mkdocs_build(root: Path) -> subprocess.CompletedProcess:
    mkdocs = Path(sys.executable).with_name("mkdocs")
    return subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(root / "site")],
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        cwd=root,
        capture_output=True,
        text=True,
    )


@pytest.fixture(scope="module")
def docs_copy(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("docs")
    shutil.copytree(DOCS, root / "docs")
    shutil.copy(REPO / "mkdocs.yml", root)
    return root


def test_the_site_builds_strictly_and_a_broken_link_or_anchor_fails_it(docs_copy):
    proc = mkdocs_build(docs_copy)
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = docs_copy / "docs" / "getting-started" / "quick-start.md"
    original = page.read_text()
    for broken in ("[gone](../guide/no-such-page.md)", "[gone](../guide/evaluation.md#no-such-heading)"):
        page.write_text(original + f"\n\nSee {broken}.\n")
        proc = mkdocs_build(docs_copy)
        assert proc.returncode != 0 and "no-such" in proc.stderr, proc.stderr[-2000:]
    page.write_text(original)


def test_every_docs_path_named_in_code_configs_and_messages_exists():
    sources = [REPO / "Snakefile", REPO / "mkdocs.yml", REPO / "Makefile", REPO / "README.md"]
    for folder in (
        "eaglenest",
        "scripts",
        "rules",
        "config",
        "benchmarks",
        "profiles",
        "envs",
        "tests",
        "docs",
    ):
        sources += [
            p for p in (REPO / folder).rglob("*") if p.suffix in (".py", ".smk", ".yaml", ".md", ".txt")
        ]
    missing = []
    for source in sources:
        if "_moved" in source.parts:
            continue
        for ref in DOCS_PATH.findall(source.read_text(errors="replace")):
            path, _, anchor = ref.partition("#")
            target = REPO / path
            if not target.is_file() or (anchor and anchor not in heading_slugs(target)):
                missing.append(f"{source.relative_to(REPO)}: {ref}")
    assert not missing, missing


def test_the_readme_is_one_screen_without_dates_or_measured_figures():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= README_CAP
    assert not DATE.findall(text)
    assert not MEASURED.findall(text), MEASURED.findall(text)
    for needed in ("make run", "make test", "vllm serve", "eaglenest plan", "--speculative-config"):
        assert needed in text, needed


def test_guide_pages_type_no_date():
    for page in hand_written_pages():
        assert not DATE.findall(page.read_text()), page.relative_to(REPO)


def test_every_record_says_when_where_and_how_each_run_was_measured():
    sys.path.insert(0, str(REPO / "benchmarks"))
    from records import MACHINE_KEYS, RECORDS, RUN_KEYS

    records = sorted(RECORDS.glob("*.json"))
    assert records
    for path in records:
        record = json.loads(path.read_text())
        assert record["name"] == path.stem and record["title"] and record["what"] and record["runs"], (
            path.name
        )
        for run in record["runs"]:
            assert all(run.get(key) for key in RUN_KEYS), (path.name, run.get("date"))
            assert DATE.fullmatch(run["date"]) and re.fullmatch(r"[0-9a-f]{7,40}(\+changes)?", run["commit"])
            assert all(key in run["machine"] for key in MACHINE_KEYS), (path.name, run["date"])
            assert run["machine"]["cpu"] or run["machine"]["gpu"]


def test_the_readmes_config_for_your_model_plans_over_the_seed_config(tmp_path):
    """The README's "Train a draft for your model" overlay, merged over config/kimi-k2.5.yaml as
    it says, is a config the workflow accepts and plans offline with an empty hub cache."""
    block = re.search(r"```yaml\n(.*?)```", (REPO / "README.md").read_text(), re.S).group(1)
    overlay = tmp_path / "my-model.yaml"
    overlay.write_text(block)
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--configfile", "config/kimi-k2.5.yaml", str(overlay)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "download_target" in proc.stdout and "train_draft" in proc.stdout
