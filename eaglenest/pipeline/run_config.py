"""The config a Snakemake run will see, read with Snakemake's own loader, merge and `--config`
parser (so `eaglenest plan` and the workflow never disagree on a value)."""

from __future__ import annotations

import re
from pathlib import Path

from eaglenest.core.errors import EaglenestError

# The Snakefile's embedded default (`configfile: "..."`, inside its no---configfile branch).
_CONFIGFILE = re.compile(r"^\s*configfile:\s*[\"']([^\"']+)[\"']", re.M)


def parse_config_entries(entries: list[str]) -> dict:
    """`--config KEY=VALUE` entries, parsed by Snakemake's own command-line parser."""
    from snakemake.cli import parse_config

    try:
        return parse_config(list(entries))
    except ValueError as e:
        raise EaglenestError(f"--config {' '.join(entries)}: {e}") from None


SNAKEFILE_NAMES = ("Snakefile", "snakefile", "workflow/Snakefile", "workflow/snakefile")


def find_snakefile(cwd=".") -> Path | None:
    """The Snakefile snakemake would pick in `cwd` when none is given."""
    for name in SNAKEFILE_NAMES:
        if (Path(cwd) / name).exists():
            return Path(cwd) / name
    return None


def load_config(workdir, snakefile, configfiles=(), config_entries=(), cwd=".") -> dict:
    """The config the workflow will see: the --configfile files (relative to where the command
    runs) merged in order, or, when none is given, the Snakefile's embedded default (relative to
    the working directory); then --config. A config file is never merged over the default."""
    from snakemake.common.configfile import load_configfile
    from snakemake.utils import update_config

    workdir, cwd = Path(workdir), Path(cwd)
    config: dict = {}
    if configfiles:
        sources = [Path(cf) if Path(cf).is_absolute() else cwd / cf for cf in configfiles]
        for cf, path in zip(configfiles, sources):
            if not path.exists():
                raise EaglenestError("config file does not exist", cf)
    else:
        m = _CONFIGFILE.search(Path(snakefile).read_text()) if snakefile else None
        if m is None or not (workdir / m.group(1)).exists():
            raise EaglenestError(
                "no config: no --configfile was given and the Snakefile's default is missing",
                workdir / m.group(1) if m else snakefile,
            )
        sources = [workdir / m.group(1)]
    for path in sources:
        update_config(config, load_configfile(path))
    update_config(config, parse_config_entries(list(config_entries)))
    if "run_dir" not in config:
        raise EaglenestError("the config has no run_dir", ", ".join(map(str, sources)))
    return config


__all__ = ["find_snakefile", "load_config", "parse_config_entries"]
