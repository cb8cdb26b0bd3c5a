"""Whole runs as plain Python functions returning a config; `--set` overrides on top."""
