"""The vLLM rollout engine: the RolloutEngine protocol over vLLM's `AsyncLLM` (vLLM 0.20 to
0.33). config holds VLLMEngineConfig, engine the VLLMEngine; requests (one sample as vLLM
requests), weights (buckets in shared memory, handed to the workers by collective_rpc) and
worker (the worker extension vLLM loads into each of its workers) are the parts it is made of."""
