"""Snakemake adapter for `train_draft`: see eaglenest.training.train."""

from eaglenest.pipeline.workflow import run_logged
from eaglenest.target.resolve import keep_caches_in, load_target
from eaglenest.training.train import train_stage

sm = snakemake  # noqa: F821 -- injected by Snakemake's `script:` directive
p = sm.params
keep_caches_in(p.run_dir)  # the trainer and transformers import remote code there
run_logged(
    sm.log[0],
    train_stage,
    run_dir=p.run_dir,
    target=load_target(sm.input.target),
    target_record=sm.input.target,
    shard_dirs=list(sm.input.shards),
    plan_path=sm.input.plan,
    tokenized_path=sm.input.data,
    prompts_path=sm.input.get("prompts"),  # a sweep's variant: the rows' sources
    t2d_npy=sm.input.t2d,
    d2t_npy=sm.input.d2t,
    draft_config_path=sm.input.draft_config,
    hp=dict(p.hp),
    gpus=p.gpus,
    device=p.device,
    hs_mode=p.hs_mode,
    hs_dtype=p.hs_dtype,
    server_cfg=dict(p.server) if p.server else None,
    server_gpus=p.server_gpus,
    shared_gpu_server_memory=p.shared_gpu_server_memory,
    out_checkpoint=sm.output.checkpoint,
    out_metrics=sm.output.metrics,
    out_curves=sm.output.curves,
    log_file=sm.log[0],
)
