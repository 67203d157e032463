"""Snakemake adapter for `extract_hidden_states` (one shard): see eaglenest.hidden_states.extract."""

from eaglenest.hidden_states.extract import extract_stage
from eaglenest.pipeline.workflow import run_logged
from eaglenest.target.resolve import keep_caches_in, load_target

sm = snakemake  # noqa: F821 -- injected by Snakemake's `script:` directive
p = sm.params
keep_caches_in(p.run_dir)  # the trainer and transformers import remote code there
target = load_target(sm.input.target)
run_logged(
    sm.log[0],
    extract_stage,
    run_dir=p.run_dir,
    target=target.path,
    tokenized_path=sm.input.data,
    plan_path=sm.input.plan,
    out_dir=sm.output.shard,
    shard=int(sm.wildcards.k),
    num_shards=p.num_shards,
    dtype=p.dtype,
    backend=p.backend,
    concurrency=p.concurrency,
    server_cfg=dict(p.server),
    trust_remote_code=target.trust_remote_code,
)
