"""Snakemake adapter for `export_draft`: see eaglenest.evaluation.export."""

from eaglenest.evaluation.export import export_stage
from eaglenest.evaluation.model_card import model_card_inputs
from eaglenest.pipeline.workflow import run_logged
from eaglenest.target.resolve import load_target

sm = snakemake  # noqa: F821 -- injected by Snakemake's `script:` directive
run_logged(
    sm.log[0],
    export_stage,
    checkpoint_dir=sm.input.checkpoint,
    out_dir=sm.output.draft,
    t2d_pt=sm.input.t2d,
    d2t_pt=sm.input.d2t,
    draft_config_path=sm.input.draft_config,
    target=load_target(sm.input.target),
    max_model_len=sm.params.max_model_len,
    hp=sm.params.hp,
    card=model_card_inputs(sm),
)
