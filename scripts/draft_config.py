"""Snakemake adapter for `draft_config`: see eaglenest.draft.config."""

from eaglenest.draft.config import draft_config_stage
from eaglenest.pipeline.workflow import run_logged
from eaglenest.target.resolve import load_target

sm = snakemake  # noqa: F821 -- injected by Snakemake's `script:` directive
p = sm.params
target = load_target(sm.input.target)
run_logged(
    sm.log[0],
    draft_config_stage,
    target_dir=target.path,
    out_path=sm.output.config,
    aux_layer_ids=p.aux_layer_ids,
    draft_vocab_size=p.draft_vocab_size,
    draft_layers=p.draft_layers,
    max_position_embeddings=p.max_model_len,
    sglang_export=p.sglang_export,
    algorithm=p.algorithm,
    mask_token_id=p.mask_token_id,
    token_freq=sm.input.token_freq or None,  # a parallel draft's only (rules/common.smk: mask_token_counts)
    trust_remote_code=target.trust_remote_code,
)
