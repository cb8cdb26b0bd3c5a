"""HandoffEndpoint: both ends of engine-to-engine handoffs for one engine, the protocol a
controller drives while only tickets and token-only states pass through it (the pages go
straight from the source's sender to the destination's receiver). A rollout instance owns
one beside its engine.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace

from rlboost.errors import RolloutError
from rlboost.migration.receiver import SampleReceiver
from rlboost.migration.result import HoldsSamples
from rlboost.migration.sender import SampleSender
from rlboost.migration.state import RequestState
from rlboost.migration.ticket import DEFAULT_TIMEOUT_S, HandoffTicket
from rlboost.transfer import TransferConfig

MAX_PENDING = 64  # batches a source serves at once (the handoff role's versions_kept ceiling)


class HandoffEndpoint:
    """The handoff protocol over one engine:

        ticket, states = src.handoff_send([3, 7])    # drain + serve; states hold tokens only
        dst.handoff_receive(ticket, [3, 7])          # pull the pages from src, resume there
        src.handoff_release(ticket, [3, 7])          # dst has them: stop serving
        src.handoff_take_back(ticket, [3, 7])        # or: dst refused, resume them on src

    The sender and receiver open their servers on first use; transfer configures them
    (bind_host and secret matter between hosts).
    """

    def __init__(self, engine: HoldsSamples, transfer: TransferConfig | None = None, *,
                 max_pending: int = MAX_PENDING):
        if not 1 <= max_pending <= MAX_PENDING:
            raise ValueError(f"max_pending must be in [1, {MAX_PENDING}], got {max_pending}")
        self.engine = engine
        self._transfer = transfer if transfer is not None else TransferConfig()
        self._max_pending = max_pending
        self._sender: SampleSender | None = None
        self._receiver: SampleReceiver | None = None

    def handoff_send(self, sample_ids: Sequence[int], mode: str = "kv"
                     ) -> tuple[HandoffTicket | None, tuple[RequestState, ...]]:
        """Drain the samples and serve them (with KV pages in kv mode) until released or taken
        back; returns the ticket (None when no sample was left to move) and their states.
        Unknown and finished ids are skipped, as export_states does. Raises RolloutError,
        draining nothing, while max_pending batches are still held."""
        if self._sender is None:
            t = self._transfer
            self._sender = SampleSender(replace(t, handoff=replace(t.handoff, versions_kept=self._max_pending)))
        ticket = self._sender.send(self.engine, sample_ids, mode)
        states = self._sender.states(ticket)
        if not states:
            self._sender.release(ticket)
            return None, ()
        return ticket, states

    def handoff_receive(self, ticket: HandoffTicket, sample_ids: Collection[int] | None = None,
                        timeout_s: float | None = DEFAULT_TIMEOUT_S) -> None:
        """Pull a ticket's batch from its source and resume `sample_ids` of it (default: all).
        Transfer errors propagate (the source still holds the samples); a refusal raises
        HandoffFailed."""
        if self._receiver is None:
            self._receiver = SampleReceiver(self._transfer)
        self._receiver.receive(self.engine, ticket, timeout_s, sample_ids)

    def handoff_release(self, ticket: HandoffTicket, sample_ids: Collection[int] | None = None) -> None:
        """Stop serving samples of a ticket sent from here (received elsewhere, or given up)."""
        if self._sender is not None:
            self._sender.release(ticket, sample_ids)

    def handoff_take_back(self, ticket: HandoffTicket, sample_ids: Collection[int] | None = None) -> None:
        """Resume here samples of a ticket sent from here whose destination refused them."""
        if self._sender is None:
            raise RolloutError("nothing was sent from this engine")
        self._sender.take_back(self.engine, ticket, sample_ids)

    def close(self) -> None:
        for side in (self._sender, self._receiver):
            if side is not None:
                side.close()
        self._sender = self._receiver = None

    def __enter__(self) -> HandoffEndpoint:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
