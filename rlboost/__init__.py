"""rlboost: RL training of LLMs on a reserved cluster plus preemptible rollout GPUs.

Importing the package is cheap: it does not import torch or Ray; submodules do.
"""

__version__ = "0.1.0"
