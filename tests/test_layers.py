"""The package's layers: each subpackage imports only from its own folder and the layers below,
so what a folder depends on can be read from the tree (docs/development/architecture.md#layout). The direction of
imports is import-linter's contract (.importlinter, run by `make lint`); these tests keep that
contract whole (every module in a layer, every layer in the docs' layout) and check what it does not:
no import circle, even inside one subpackage or one function, and imports at the top of each
module unless one is kept lazy on purpose."""

import ast
import configparser
import graphlib
import re
import sys
from pathlib import Path

from eaglenest.pipeline.code_hash import PACKAGE_DIR, package_imports

CONTRACT = PACKAGE_DIR.parent / ".importlinter"


def contract_layers() -> list[set[str]]:
    """The layers of .importlinter's contract, highest first, as folder names ("training");
    "a | b" on one line is one layer of two independent subpackages."""
    parser = configparser.ConfigParser()
    parser.read(CONTRACT)
    return [
        {name.strip().removeprefix("eaglenest.") for name in line.split("|")}
        for line in parser["importlinter:contract:layers"]["layers"].strip().splitlines()
    ]


LAYER_OF = {name: rank for rank, names in enumerate(contract_layers()) for name in names}


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name under eaglenest ("training.train")."""
    found = {}
    for path in PACKAGE_DIR.rglob("*.py"):
        rel = path.relative_to(PACKAGE_DIR).with_suffix("")
        if rel.name == "__init__" or "assets" in rel.parts:
            continue
        found[".".join(rel.parts)] = path
    return found


def folder(module: str) -> str:
    return module.split(".")[0]


def test_every_module_sits_in_a_layer_folder():
    """A module at the package's top (other than the CLI) or in a new folder must be given a
    place in the contract's layers, and in the docs' layout."""
    stray = sorted(m for m in modules() if folder(m) not in LAYER_OF)
    assert not stray, f"modules outside the layer folders: {stray}"
    page = (PACKAGE_DIR.parent / "docs" / "development" / "architecture.md").read_text()
    layout = page.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    missing = sorted(f for f in LAYER_OF if f != "cli" and not re.search(rf"^ +{f}/ ", layout, re.M))
    assert not missing, f"folders missing from docs/development/architecture.md's layout: {missing}"


def test_no_import_circle_even_inside_functions():
    graph = {module: set(package_imports(path)) - {module} for module, path in modules().items()}
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as circle:
        raise AssertionError(f"import circle: {' -> '.join(circle.args[1])}") from None


def test_the_contract_sees_imports_of_every_form(tmp_path):
    """The checks above are only as good as package_imports: each import form counts."""
    source = tmp_path / "probe.py"
    source.write_text(
        "import eaglenest.core.io\n"
        "from eaglenest.training import train\n"
        "from eaglenest.data.tokenize import tokenize_stage\n"
        "def f():\n"
        "    from eaglenest.engine.server import Server\n"
        "from eaglenest import cli\n"
    )
    assert package_imports(source) == {
        "core.io",
        "training.train",
        "data.tokenize",
        "engine.server",
        "cli",
    }


def imports_inside_functions(path: Path) -> list[tuple[int, str, bool]]:
    """(line, module, says why) for each import inside a function of `path`: says why when a
    comment stands on its line or right above its block of imports."""
    lines = path.read_text().splitlines()
    found = []
    for node in ast.walk(ast.parse("\n".join(lines))):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for sub in ast.walk(node):
            if isinstance(sub, (ast.Import, ast.ImportFrom)):
                module = sub.module if isinstance(sub, ast.ImportFrom) else sub.names[0].name
                above = sub.lineno - 2
                while above >= 0 and re.match(r"\s*(import |from \S+ import )", lines[above]):
                    above -= 1
                says_why = "#" in lines[sub.lineno - 1] or lines[above].strip().startswith("#")
                found.append((sub.lineno, module or "", says_why))
    return found


def test_imports_sit_at_the_top_unless_kept_lazy_on_purpose():
    """The standard library is imported at the top of each module, and an eaglenest module
    imported inside a function says why there. Third-party libraries may be imported where they
    are used: torch, transformers, vLLM, speculators and pandas take up to seconds to import, and
    the modules Snakemake imports when it plans must not load them (every dry run of the
    suite runs with torch unimportable: conftest.SNAKEMAKE_WITHOUT_TORCH)."""
    misplaced = []
    for path in sorted(modules().values()):
        where = path.relative_to(PACKAGE_DIR.parent)
        for line, imported, says_why in imports_inside_functions(path):
            top = imported.split(".")[0]
            if top in sys.stdlib_module_names:
                misplaced.append(f"{where}:{line} {imported}: the standard library belongs at the top")
            elif top == "eaglenest" and not says_why:
                misplaced.append(f"{where}:{line} {imported}: no comment says why it is lazy")
    assert not misplaced, "imports inside functions:\n" + "\n".join(misplaced)
