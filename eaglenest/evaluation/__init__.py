"""Measuring the draft in vLLM (acceptance, losslessness, throughput) and exporting it as a
folder vLLM serves."""
