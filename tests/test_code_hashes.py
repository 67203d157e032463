"""Each rule's code hash covers what its script runs, found from the imports, so an edit of any
module a stage reaches reruns it, and an edit of a docstring or comment reruns nothing."""

import json
import re
import subprocess
import sys
from pathlib import Path

from conftest import fresh_clone

REPO = Path(__file__).resolve().parent.parent


def hashes_in(clone: Path) -> dict[str, str]:
    code = (
        "from eaglenest.pipeline.code_hash import code_hash\n"
        "for s in ('train_draft', 'evaluate_acceptance', 'tokenize', 'prepare_prompts'):\n"
        "    print(s, code_hash(s))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=clone, capture_output=True, text=True, check=True)
    return dict(line.split() for line in out.stdout.splitlines())


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))


def test_a_behaviour_edit_in_any_module_a_stage_reaches_reruns_it(tmp_path):
    clone = fresh_clone(tmp_path / "clone")
    before = hashes_in(clone)
    # The next calls read the facts the first one kept: an edited file must be seen through them.
    assert list((clone / "eaglenest" / "__pycache__").glob("code-facts.*.json"))
    # speculators' split of the rows the draft trains on, in eaglenest.training.sweep: train_draft
    # reaches it through train.py (a hand-written list of modules once left it out).
    edit(
        clone / "eaglenest" / "training" / "sweep.py",
        "ratio = (len(kept) + 0.5)",
        "ratio = (len(kept) + 0.25)",
    )
    after = hashes_in(clone)
    assert after["train_draft"] != before["train_draft"]
    assert (
        after["tokenize"] == before["tokenize"]
        and after["evaluate_acceptance"] == before["evaluate_acceptance"]
    )
    # A module imported at the bottom of the graph (errors) reaches every stage.
    edit(
        clone / "eaglenest" / "core" / "errors.py", 'f"{self.path}: {problem}"', 'f"{self.path}:: {problem}"'
    )
    assert all(hashes_in(clone)[s] != after[s] for s in after)


def test_a_damaged_facts_cache_gives_the_same_hashes(tmp_path):
    """The facts cache only saves time: one left half-written or wrong is read past, and a file
    that is gone (a test's temporary module) leaves it at its next save."""
    clone = fresh_clone(tmp_path / "clone")
    before = hashes_in(clone)
    (cache,) = (clone / "eaglenest" / "__pycache__").glob("code-facts.*.json")
    for damaged in (
        '{"truncated',
        "[1, 2]",
        json.dumps({k: {"sha256": 0} for k in json.loads(cache.read_text())}),
    ):
        cache.write_text(damaged)
        assert hashes_in(clone) == before
        assert all(f["sha256"] != 0 for f in json.loads(cache.read_text()).values())  # mended
    gone = str(tmp_path / "gone.py")
    facts = json.loads(cache.read_text())
    cache.write_text(
        json.dumps({**facts, next(iter(facts)): {"sha256": 0}, gone: next(iter(facts.values()))})
    )
    assert hashes_in(clone) == before
    assert gone not in json.loads(cache.read_text())


def test_docstrings_comments_and_layout_rerun_nothing(tmp_path):
    clone = fresh_clone(tmp_path / "clone")
    before = hashes_in(clone)
    edit(
        clone / "eaglenest" / "training" / "sweep.py",
        '    """The rows a `fraction`',
        '    """Reworded: the rows a `fraction`',
    )
    edit(clone / "eaglenest" / "data" / "tokenize.py", "\nimport ", "\n# a new comment\n\nimport ")
    assert hashes_in(clone) == before


def test_every_rule_hashes_its_own_script():
    """A rule that names another rule's script, or none, would go stale."""
    for smk in (REPO / "rules").glob("*.smk"):
        text = smk.read_text()
        for block in re.split(r"\n(?=\s*(?:rule|use rule) )", text):
            script = re.search(r'script:\s*"\.\./scripts/(\w+)\.py"', block)
            if not script or block.lstrip().startswith("use rule"):
                continue
            name = script.group(1)
            if name == "download_target":  # its outputs are the hub cache's: no code hash, on purpose
                assert not re.search(r"\bcode=", block)
                continue
            hashed = re.search(r'code=code_hash\("(\w+)"', block)
            assert (hashed and hashed.group(1) == name) or "code=train_code()" in block, (smk.name, name)
