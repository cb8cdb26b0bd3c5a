"""Pull-based weight streaming: manifests, the publisher (trainer side) and the puller.

The trainer publishes each version once; any instance pulls the version it needs from
the trainer and from peers that already hold it, over TCP, shared memory or UCX.
"""

from rlboost.transfer.config import TransferConfig
from rlboost.transfer.manifest import Manifest, TensorSpec
from rlboost.transfer.progress import TqdmProgress
from rlboost.transfer.publisher import WeightPublisher
from rlboost.transfer.pulled import PulledWeights, PullHandle
from rlboost.transfer.puller import WeightPuller

__all__ = [
    "Manifest",
    "PullHandle",
    "PulledWeights",
    "TensorSpec",
    "TqdmProgress",
    "TransferConfig",
    "WeightPublisher",
    "WeightPuller",
]
