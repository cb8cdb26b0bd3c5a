"""Describing and overriding a run's configuration from the command line."""
