"""What the adapters of engines that run in processes of their own (SGLang, vLLM) share: the
engine thread and its loop (loop_thread, engine), a streamed sample (sample), the decode rate
(rate), the config fields and their checks (fields), and what the adapter knows of the
checkpoint the engine loads (checkpoint_facts)."""
