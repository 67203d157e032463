"""Snakemake adapter for `download_target`: see eaglenest.target."""

from eaglenest.target import download_stage
from eaglenest.workflow import run_logged

sm = snakemake  # noqa: F821 -- injected by Snakemake's `script:` directive
p = sm.params
run_logged(sm.log[0], download_stage, repo_id=p.target, revision=p.revision, cache_dir=p.cache_dir)
