"""Snakemake adapter for `export_draft_sglang`: see eaglenest.evaluation.sglang_export."""

from eaglenest.evaluation.model_card import model_card_inputs
from eaglenest.evaluation.sglang_export import export_sglang_stage
from eaglenest.pipeline.workflow import run_logged
from eaglenest.target.resolve import load_target

sm = snakemake  # noqa: F821 -- injected by Snakemake's `script:` directive
run_logged(
    sm.log[0],
    export_sglang_stage,
    vllm_draft_dir=sm.input.draft,
    out_dir=sm.output.draft,
    target=load_target(sm.input.target),
    card=model_card_inputs(sm),
)
