"""Pull-based weight streaming: manifests, the publisher (trainer side) and the puller.

The trainer publishes each version once; any instance pulls the version it needs from
the trainer and from peers that already hold it (even partly), over TCP, shared memory
or UCX, and re-serves what it holds to later newcomers::

    with WeightPublisher(TransferConfig(secret=b"s")) as pub:
        pub.publish(1, model.state_dict())
        with WeightPuller(pub.address, TransferConfig(secret=b"s")) as puller:
            weights = puller.pull()          # Mapping[str, Tensor], zero-copy views
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
