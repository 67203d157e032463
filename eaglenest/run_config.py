"""The config a Snakemake run will see, read with Snakemake's own loader, merge and `--config`
parser (so `eaglenest plan` and the workflow never disagree on a value)."""

from __future__ import annotations

import re
from pathlib import Path

from eaglenest.errors import EaglenestError

_CONFIGFILE = re.compile(r"^configfile:\s*[\"']([^\"']+)[\"']", re.M)


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
    """The config the workflow will see: the Snakefile's `configfile:` (relative to the working
    directory, skipped when absent there and --configfile is given), then each --configfile
    (relative to where the command runs), then --config."""
    from snakemake.common.configfile import load_configfile
    from snakemake.utils import update_config

    workdir, cwd = Path(workdir), Path(cwd)
    config: dict = {}
    m = _CONFIGFILE.search(Path(snakefile).read_text()) if snakefile else None
    default = workdir / m.group(1) if m else None
    if default is not None and default.exists():
        update_config(config, load_configfile(default))
    elif not configfiles:
        raise EaglenestError(
            "no config: the Snakefile's configfile is missing and no --configfile was given", default
        )
    for cf in configfiles:
        path = Path(cf) if Path(cf).is_absolute() else cwd / cf
        if not path.exists():
            raise EaglenestError("config file does not exist", cf)
        update_config(config, load_configfile(path))
    update_config(config, parse_config_entries(list(config_entries)))
    if "run_dir" not in config:
        raise EaglenestError("the config has no run_dir", default)
    return config


__all__ = ["find_snakefile", "load_config", "parse_config_entries"]
