"""Rollout engines behind one protocol (embedded torch engine, SGLang and vLLM adapters,
emulated), and the host that answers one engine's protocol calls for a controller."""
