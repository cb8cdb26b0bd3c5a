"""The vLLM rollout engine: the RolloutEngine protocol over vLLM's `AsyncLLM` (vLLM 0.20 to
0.33, on GPUs or as its CPU build). config holds VLLMEngineConfig, engine the VLLMEngine; api
(the vLLM classes and checks of the installed build), requests (one sample as vLLM requests),
weights (buckets in shared memory, handed to the workers by collective_rpc), worker (the
worker extension vLLM loads into each of its workers) and logs (vLLM's errors read back
from its processes) are the parts it is made of."""
