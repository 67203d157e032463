"""The target's hidden states for training: extraction into verified shards, and serving them
to the trainer while it runs (online and hybrid modes)."""
