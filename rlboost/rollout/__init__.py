"""Rollout engines behind one protocol (embedded torch engine, SGLang adapter, emulated) and the handoff between them."""
