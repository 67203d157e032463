"""The training data's stages: prompts, public benchmark prompts, regeneration by the target,
tokenization with its chat template and loss mask, and the draft vocabulary."""
