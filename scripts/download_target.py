"""Snakemake adapter for `download_target`: see eaglenest.target.resolve."""

from eaglenest.pipeline.workflow import run_logged
from eaglenest.target.resolve import download_stage

sm = snakemake  # noqa: F821 -- injected by Snakemake's `script:` directive
p = sm.params
run_logged(
    sm.log[0],
    download_stage,
    repo_id=p.target,
    revision=p.revision,
    cache_dir=p.cache_dir,
    trust_remote_code=p.trust_remote_code,
    allow_unpinned_remote_code=p.allow_unpinned_remote_code,
    disk_margin_gb=p.disk_margin_gb,
)
