"""eaglenest: train an EAGLE-3 draft head for a served target model.

The workflow (Snakefile, rules/) orders the stages; this package holds their logic so that each
rule's script stays a thin adapter and every stage can be tested and run on its own.

One folder per layer, lowest first: core, pipeline, engine and target, planning and data, draft,
hidden_states, training, evaluation, report; a module imports only from its own folder and the
layers below (tests/test_layers.py, and docs/development/architecture.md#layout).

Each rule has one entry point of the same shape, `<module>.<name>_stage(...)` (prepare_stage,
regenerate_stage, tokenize_stage, mapping_stage, extract_stage, train_stage, ...): its script
calls it with keyword arguments named after the rule's inputs, params and outputs, through
`pipeline.workflow.run_logged(log, stage, **named)`, which sends the stage's logging (and a failure's
traceback) to the rule's `log:` file. A stage writes its outputs under temporary names and
renames them when complete.
"""

__version__ = "0.1.0"
