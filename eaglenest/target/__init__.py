"""The target model: resolving a folder or hub id to one artifact, the hub cache, and the
builders of stand-in targets (the tiny Llama, the Kimi-K2.5 miniature, a GGUF import)."""
