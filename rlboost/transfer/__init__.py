"""Pull-based weight streaming: manifests, the publisher (trainer side) and the puller.

The trainer publishes each version once; any instance pulls the version it needs from
the trainer and from peers that already hold it (even partly), over TCP, shared memory
or UCX, and re-serves what it holds to later newcomers::

    config = TransferConfig(secret=run_secret())   # the same secret in every process of the run
    with WeightPublisher(config) as pub:
        pub.publish(1, model.state_dict())
        with WeightPuller(pub.address, config) as puller:
            weights = puller.pull()          # Mapping[str, Tensor], zero-copy views

Every chunk is checked against a tag in the publisher's manifest that no process without
the secret can forge (IntegrityError otherwise). A version laid out like the previous one
is also served as a lossless delta against it; ``puller.pull(v + 1, into=weights)`` takes
that delta when it pays and checks the rebuilt bytes against version v + 1's own tags,
falling back to the full version on any doubt (transfer/delta.py, transfer/delta_pull.py).
"""

from typing import TYPE_CHECKING

from rlboost.transfer.config import ServerConfig, TransferConfig, new_secret, run_secret

if TYPE_CHECKING:
    from rlboost.transfer.manifest import Manifest, TensorSpec
    from rlboost.transfer.progress import TqdmProgress
    from rlboost.transfer.publisher import WeightPublisher
    from rlboost.transfer.pulled import PulledWeights, PullHandle
    from rlboost.transfer.puller import WeightPuller

__all__ = [
    "Manifest",
    "PullHandle",
    "PulledWeights",
    "ServerConfig",
    "TensorSpec",
    "TqdmProgress",
    "TransferConfig",
    "WeightPublisher",
    "WeightPuller",
    "new_secret",
    "run_secret",
]

# The rest loads on first use (they bring torch): a process that reads a transfer config
# (the controller, a simulator) does not pay for them.
_LAZY = {"Manifest": "manifest", "TensorSpec": "manifest", "TqdmProgress": "progress",
         "WeightPublisher": "publisher", "PulledWeights": "pulled", "PullHandle": "pulled",
         "WeightPuller": "puller"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"rlboost.transfer.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
