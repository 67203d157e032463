"""The engines' processes: the vLLM server GPU rules share (start, lease, stop by PID), its
supervisor, and the patches and connector that let vLLM's CPU build run the pipeline."""
