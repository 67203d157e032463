"""Training the draft with speculators' trainer: its inputs and command line, the checks
between stages, sweeps, and every speculators internal eaglenest reaches past the CLI for."""
