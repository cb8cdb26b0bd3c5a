"""WeightPublisher: the trainer side. Each version is copied once into a shared-memory
staging region of a VersionServer (transfer/versions.py) and served from there;
publishing returns as soon as the copy and the chunk tags (the integrity check pullers
verify) are done. A version laid out like the one before is then also served as a delta
against it, encoded on a thread of its own (transfer/delta.py) while the trainer goes on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch

from rlboost.errors import TransferClosed
from rlboost.transfer import descriptors
from rlboost.transfer.closing import Closing
from rlboost.transfer.config import ServerConfig, TransferConfig
from rlboost.transfer.delta import DeltaEncoder, changed_share, delta_key, is_delta_key, sample_values
from rlboost.transfer.manifest import Manifest
from rlboost.transfer.versions import VersionServer


class WeightPublisher(Closing):
    """Serves published weight versions to pullers.

    Either ``publish(version, named_tensors)`` or, to gather bucket by bucket straight
    into staging, ``views = stage(version, manifest)``, fill the views, ``commit(version)``.
    Staging views stay valid until the version is retired (``versions_kept`` newer ones).
    """

    def __init__(self, config: TransferConfig | None = None, server: ServerConfig | None = None, *,
                 deltas: bool | None = None):
        """`server`: this publisher's role limits (default: ``config.publisher``, the
        trainer's). `deltas`: serve each version also as a delta against the previous one
        (default: ``config.delta`` for the trainer's role, off for others)."""
        self.config = config = config if config is not None else TransferConfig()
        self.server_config = server if server is not None else config.publisher
        self._versions = VersionServer(config, self.server_config)
        self._staged: dict[int, tuple[Manifest, torch.Tensor]] = {}
        self._last: Manifest | None = None  # the latest committed version, the next delta's base
        use_deltas = (config.delta and server is None) if deltas is None else deltas
        self._deltas = DeltaEncoder(self._versions.store, config) if use_deltas else None
        self._sample: list[torch.Tensor] | None = None  # of the latest version: see sample_values
        self._changed: dict[int, float | None] = {}  # version -> share of values changed since its base
        self._closed = False

    @property
    def address(self) -> str:
        """Where pullers connect: "host:port"."""
        return self._versions.address

    @property
    def versions(self) -> list[int]:
        return [v for v in self._versions.keys() if not is_delta_key(v)]

    @property
    def latest(self) -> int | None:
        return self._versions.latest

    def stage(self, version: int, manifest: Manifest) -> dict[str, torch.Tensor]:
        """Writable named views into the staging region of `version`, laid out by `manifest`."""
        self._check_open()
        staged = self._versions.stage(version, manifest)
        self._staged[version] = (manifest, staged)
        return descriptors.tensor_views(staged, manifest)

    def commit(self, version: int) -> Manifest:
        """Checksums the staged bytes and starts serving `version`; returns its manifest."""
        self._check_open()
        if version not in self._staged:
            raise ValueError(f"version {version} was not staged")
        manifest, staged = self._staged.pop(version)
        base = self._delta_base(manifest)
        if self._deltas is not None:  # a few values of each version: why a delta pays off, or not
            sample, previous = sample_values(staged, manifest), self._sample
            self._sample = sample
            if base is not None and previous is not None:
                self._changed[version] = changed_share(previous, sample)
                for old in [v for v in self._changed if v < version - 64]:
                    del self._changed[old]
        manifest = replace(manifest, delta_base=base)  # tells pullers that holding `base` pays off
        self._last = manifest = self._versions.commit(version, manifest)
        if base is not None:
            self._deltas.submit(base, version)
        return manifest

    def _delta_base(self, manifest: Manifest) -> int | None:
        """The version a delta into `manifest` starts from: the latest one, when it is still
        served and laid out the same."""
        last = self._last
        if self._deltas is None or last is None or not last.same_layout(manifest):
            return None
        return last.version if last.version < manifest.version and last.version in self.versions else None

    def wait_for_deltas(self, timeout: float | None = None) -> bool:
        """Waits until every delta asked for so far is served (or failed); False on timeout."""
        return self._deltas is None or self._deltas.wait_idle(timeout)

    def delta_stats(self) -> list[dict]:
        """The latest deltas, oldest first: base, target, declined, bytes, target_bytes,
        encode_s (encoding alone, native threads), total_s (with tagging), values_changed
        (the share of the target's values whose bits differ from the base's, sampled), or
        an error."""
        if self._deltas is None:
            return []
        return [{**d, "values_changed": self._changed.get(d["target"])} for d in self._deltas.stats()]

    def publish(self, version: int, named_tensors: Mapping[str, torch.Tensor]) -> Manifest:
        """Copies tensors (any device) into staging and serves them as `version`."""
        manifest = Manifest.build(version, named_tensors, self.config.alignment)
        views = self.stage(version, manifest)
        try:
            descriptors.copy_tensors(views, named_tensors)
        except BaseException:
            self.discard(version)
            raise
        return self.commit(version)

    def discard(self, version: int) -> None:
        """Drops a staged version that will not be committed."""
        self._staged.pop(version, None)
        self._versions.discard(version)

    def retire(self, version: int, timeout: float | None = None) -> None:
        """Stops serving `version` (and the delta into it), waiting until no read of it is in flight."""
        self._versions.retire(version, timeout)
        self._versions.retire(delta_key(version), timeout)

    def stats(self) -> dict:
        """Server counters (bytes_sent, chunks_sent, auth_failures, protocol_errors, ...),
        plus held_bytes: the memory of every version held (served, still read, staged)."""
        return self._versions.stats()

    def close(self) -> None:
        """Stops serving and joins every server thread. Idempotent."""
        if not self._closed:
            self._closed = True
            if self._deltas is not None:
                self._deltas.close()
            self._versions.close()
            self._staged.clear()

    def _check_open(self) -> None:
        if self._closed:
            raise TransferClosed("publisher is closed")

