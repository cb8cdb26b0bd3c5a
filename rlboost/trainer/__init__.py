"""Training side of rlboost: GRPO objective, micro-batches, FSDP2 sharding and weight gather.

Submodules import torch; importing this package alone does not.
"""
