"""What a run will do and need before it runs: `eaglenest plan` and the disk, memory and GPU
estimates the stages check against."""
