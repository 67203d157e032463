"""Layer 0, imported by every other: the user-facing error and safe reading and writing of files."""
