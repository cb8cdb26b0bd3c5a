"""SampleReceiver: the destination end of a handoff between processes. Given a ticket, it
pulls the packed batch straight from the source's SampleSender through the transfer
layer, unpacks it and resumes the samples on its engine; a refusal leaves them with the
sender, which takes them back.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import replace

from rlboost.errors import HandoffFailed
from rlboost.migration.batch import unpack_batch
from rlboost.migration.result import HandoffResult, HoldsSamples, make_result, subset
from rlboost.migration.ticket import DEFAULT_TIMEOUT_S, HandoffTicket
from rlboost.transfer import TransferConfig, WeightPuller
from rlboost.transfer.versions import pull_bytes


class SampleReceiver:
    """Destination side: pulls a ticket's batch from the source's sender and resumes it."""

    def __init__(self, config: TransferConfig | None = None):
        config = config if config is not None else TransferConfig()
        self.puller = WeightPuller((), replace(config, relay=False))  # a batch is for this engine alone

    def receive(self, dst: HoldsSamples, ticket: HandoffTicket, timeout: float | None = DEFAULT_TIMEOUT_S,
                sample_ids: Collection[int] | None = None) -> HandoffResult:
        """Pull, unpack and import (only `sample_ids` of the ticket, when given). Transfer
        errors propagate, TransferTimeout after `timeout` s (the sender still holds the
        batch); a refusing destination raises HandoffFailed with the batch, and the
        sender's take_back() resumes it on the source."""
        t0 = time.perf_counter()
        buffer = pull_bytes(self.puller, ticket.address, ticket.key, ticket.nbytes, timeout)
        t1 = time.perf_counter()
        batch = unpack_batch(buffer)
        if sample_ids is not None:
            batch = subset(batch, set(sample_ids))
        t2 = time.perf_counter()
        try:
            if batch.states:
                dst.import_states(batch)
        except Exception as exc:
            raise HandoffFailed(f"destination refused samples {list(batch.sample_ids)[:8]} ({exc}); "
                                "the sender still holds them (take_back)", batch=batch) from exc
        t3 = time.perf_counter()
        return make_result(ticket.mode, batch, ticket.nbytes, ticket.drain_s, ticket.pack_s,
                           ticket.publish_s + t1 - t0, t2 - t1, t3 - t2)

    def close(self) -> None:
        self.puller.close()

    def __enter__(self) -> SampleReceiver:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
