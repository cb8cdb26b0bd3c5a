"""Tests of the request-state codec, the batch codec and KV page copies."""
