"""eaglenest: train an EAGLE-3 draft head for a served target model.

The workflow (Snakefile, rules/) orders the stages; this package holds their logic so that each
rule's script stays a thin adapter and every stage can be tested and run on its own.
"""

__version__ = "0.1.0"
