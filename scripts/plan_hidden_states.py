"""Snakemake adapter for `plan_hidden_states`: see eaglenest.hidden_states.extract."""

from pathlib import Path

from eaglenest.hidden_states.extract import plan_stage
from eaglenest.pipeline.workflow import run_logged
from eaglenest.target.resolve import load_target

sm = snakemake  # noqa: F821 -- injected by Snakemake's `script:` directive
p = sm.params
run_logged(
    sm.log[0],
    plan_stage,
    metadata_path=sm.input.metadata,
    target=load_target(sm.input.target).path,
    aux_layer_ids=p.aux_layer_ids,
    out_dir=Path(sm.output.plan).parent,
    num_shards=p.num_shards,
    dtype=p.dtype,
    mode=p.mode,
    data_loaders=p.data_loaders,
    disk_margin_gb=p.disk_margin_gb,
    plan_path=sm.output.plan,
    run_dir=p.run_dir,
    tokenized_path=sm.input.data,
    extraction=p.extraction,
)
