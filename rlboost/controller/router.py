"""Router: where every sample runs, decided per sample from measured token rates.

A sample waits in the controller's queue until an instance has a free slot, goes to the
instance that would finish its outstanding work soonest, and is moved (work stealing) when
an idle or newly joined instance would finish it clearly sooner than where it is. An
instance with a deadline (draining) takes only samples it would surely finish before it.
Pure policy: it returns decisions; the driver carries them out.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from dataclasses import dataclass
from typing import Callable, Iterable

from rlboost.controller.estimates import RateModel
from rlboost.controller.records import GROUP_STRIDE

DISPATCH_MODES = ("least_work", "group_round_robin")


@dataclass(kw_only=True, slots=True)
class RouterConfig:
    """Routing and work-stealing settings.

    retry_budget is how many instance losses one sample may survive before its step fails.
    A sample is stolen only if it would finish at least steal_margin (a fraction) and
    min_steal_gain_s sooner on the target, counting the re-prefill of its tokens.
    """

    retry_budget: int = 3
    """instance losses one sample may survive before its step fails"""
    steal_margin: float = 0.3
    """a sample moves to an idle instance only if it finishes this fraction sooner there"""
    min_steal_gain_s: float = 2.0
    """... and at least this many seconds sooner, re-prefill included"""
    max_moves_per_tick: int = 64
    """most samples stolen per controller round"""
    prefill_tokens_per_s: float = 10000.0
    """prefill rate assumed when pricing a move's re-prefill"""
    dispatch: str = "least_work"
    """least_work (each sample where it finishes soonest) or group_round_robin (the published scheduler)"""

    def __post_init__(self) -> None:
        if self.dispatch not in DISPATCH_MODES:
            raise ValueError(f"dispatch must be one of {DISPATCH_MODES}, got {self.dispatch!r}")
        if self.retry_budget < 0:
            raise ValueError(f"retry_budget must be >= 0, got {self.retry_budget}")
        if not 0.0 <= self.steal_margin < 1.0:
            raise ValueError(f"steal_margin must be in [0, 1), got {self.steal_margin}")
        if self.min_steal_gain_s < 0:
            raise ValueError(f"min_steal_gain_s must be >= 0, got {self.min_steal_gain_s}")
        if self.max_moves_per_tick < 0:
            raise ValueError(f"max_moves_per_tick must be >= 0, got {self.max_moves_per_tick}")
        if not self.prefill_tokens_per_s > 0:
            raise ValueError(f"prefill_tokens_per_s must be > 0, got {self.prefill_tokens_per_s}")


@dataclass(slots=True)
class InstanceView:
    """What the router needs to know about one instance right now.

    time_left_s (a draining instance): seconds until its samples leave; it takes only samples
    that fit in them (Router.fits). None: no deadline.
    """

    instance_id: str
    capacity: int
    rates: RateModel
    accepts_new: bool = True  # False: only a source of samples
    max_model_len: int | None = None  # longest prompt + output it takes (None: not declared)
    time_left_s: float | None = None


@dataclass(frozen=True, slots=True)
class Assign:
    instance_id: str
    sample_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Move:
    source: str
    target: str
    sample_ids: tuple[int, ...]


class Router:
    """Sample -> instance assignments, the queue of unplaced samples, and retry budgets."""

    def __init__(self, config: RouterConfig):
        self.config = config
        self._turn = 0  # group_round_robin's counter (it runs on across steps, as the published one does)
        self.begin_step(())

    def begin_step(self, sample_ids: Iterable[int]) -> None:
        self._queue: deque[int] = deque(sample_ids)
        self._owner: dict[int, str] = {}
        self._by_instance: dict[str, set[int]] = {}
        self.failures: Counter[int] = Counter()
        self._refused: dict[int, dict[str, str]] = {}  # sample -> {instance: why it refused it}

    def take_over(self, other: Router) -> None:
        """Hold another router's step from now (a step ahead becomes the running one): its
        queue, assignments, retry budgets and refusals; `other` is left empty."""
        self._queue, self._owner, self._by_instance = other._queue, other._owner, other._by_instance
        self.failures, self._refused = other.failures, other._refused
        other.begin_step(())

    # -- bookkeeping -------------------------------------------------------------------------

    def owner(self, sample_id: int) -> str | None:
        return self._owner.get(sample_id)

    def samples_on(self, instance_id: str) -> tuple[int, ...]:
        return tuple(sorted(self._by_instance.get(instance_id, ())))

    @property
    def queued(self) -> tuple[int, ...]:
        return tuple(self._queue)

    def assign(self, sample_id: int, instance_id: str) -> None:
        self.unassign(sample_id)
        self._owner[sample_id] = instance_id
        self._by_instance.setdefault(instance_id, set()).add(sample_id)

    def unassign(self, sample_id: int) -> None:
        iid = self._owner.pop(sample_id, None)
        if iid is not None:
            self._by_instance[iid].discard(sample_id)

    def finish(self, sample_id: int) -> None:
        self.unassign(sample_id)

    def requeue(self, sample_ids: Iterable[int], *, failed: bool) -> None:
        """Put samples at the front of the queue (they carry progress); failed ones spend budget."""
        for sid in sorted(sample_ids, reverse=True):
            self.unassign(sid)
            if failed:
                self.failures[sid] += 1
            if sid not in self._queue:
                self._queue.appendleft(sid)

    def release(self, instance_id: str, *, failed: bool) -> tuple[int, ...]:
        """Take every sample off an instance and queue it again; return them."""
        sids = self.samples_on(instance_id)
        self.requeue(sids, failed=failed)
        self._by_instance.pop(instance_id, None)
        return sids

    def refuse(self, sample_id: int, instance_id: str, reason: str) -> None:
        """The instance refused the sample: queue it again (no budget spent) and never offer
        it that instance again this step."""
        self._refused.setdefault(sample_id, {})[instance_id] = reason
        self.requeue([sample_id], failed=False)

    def refusals(self, sample_id: int) -> dict[str, str]:
        """Instances that refused the sample this step, with their reasons."""
        return dict(self._refused.get(sample_id, {}))

    def exhausted(self) -> tuple[int, ...]:
        """Samples that lost more instances than the retry budget allows."""
        return tuple(sorted(s for s, n in self.failures.items() if n > self.config.retry_budget))

    # -- decisions ---------------------------------------------------------------------------

    def can_run(self, sample_id: int, view: InstanceView, length: Callable[[int], int] | None) -> bool:
        """Whether the instance may be offered the sample: it has not refused it, and the
        sample's longest possible length (prompt + max_new_tokens) fits what it declares."""
        if view.instance_id in self._refused.get(sample_id, ()):
            return False
        return view.max_model_len is None or length is None or length(sample_id) <= view.max_model_len

    def fits(self, sample_id: int, view: InstanceView, k: int, budget: Callable[[int], int] | None,
             position: Callable[[int], int] | None) -> bool:
        """Whether the sample would surely finish on the instance before its deadline (always,
        without one): re-prefill of its position, then its whole remaining token budget at the
        per-sample rate with k samples there. No budget known: it does not fit."""
        if view.time_left_s is None:
            return True
        if budget is None:
            return False
        prefill = position(sample_id) / self.config.prefill_tokens_per_s if position is not None else 0.0
        return prefill + budget(sample_id) / view.rates.rate_at(k) <= view.time_left_s

    def dispatch(self, instances: list[InstanceView], remaining: Callable[[int], float],
                 length: Callable[[int], int] | None = None, budget: Callable[[int], int] | None = None,
                 position: Callable[[int], int] | None = None) -> list[Assign]:
        """Place queued samples on free slots, each where outstanding work / rate is least.

        length(sample) is its longest possible prompt + output, checked against each
        instance's max_model_len; budget(sample) its most tokens still to come and
        position(sample) the tokens a re-prefill feeds, for instances with a deadline (fits).
        A sample no open instance can run keeps its place in the queue.
        """
        if self.config.dispatch == "group_round_robin":
            return self._dispatch_groups(instances, length)
        open_ = [v for v in instances
                 if v.accepts_new and len(self._by_instance.get(v.instance_id, ())) < v.capacity]
        if not self._queue or not open_:
            return []
        load = {v.instance_id: [len(self._by_instance.get(v.instance_id, ())),
                                sum(remaining(s) for s in self._by_instance.get(v.instance_id, ()))]
                for v in open_}
        placed: dict[str, list[int]] = {}
        waiting: deque[int] = deque()
        heap: list | None = None  # open instances by key, while queued samples need the same work
        heap_need = None
        plain = all(v.time_left_s is None and v.max_model_len is None for v in open_)
        free = sum(1 for v in open_ if load[v.instance_id][0] < v.capacity)
        while self._queue and free:
            sid = self._queue.popleft()
            need = remaining(sid)
            if plain and sid not in self._refused:
                # the same choice as the scan below, by a heap: only the chosen key changes
                if heap is None or need != heap_need:
                    heap, heap_need = self._keyed(open_, load, need), need
                best = self._pop_best(heap, load)
            else:
                heap, best = None, self._scan(sid, open_, load, need, length, budget, position)
            if best is None:
                waiting.append(sid)
                continue
            load[best.instance_id][0] += 1
            load[best.instance_id][1] += need
            if load[best.instance_id][0] >= best.capacity:
                free -= 1
            elif heap is not None:
                n, work = load[best.instance_id]
                heapq.heappush(heap, ((work + need) / best.rates.full_rate(best.capacity), n, best.instance_id, best))
            self.assign(sid, best.instance_id)
            placed.setdefault(best.instance_id, []).append(sid)
        self._queue.extendleft(reversed(waiting))
        return [Assign(iid, tuple(sids)) for iid, sids in sorted(placed.items())]

    def _dispatch_groups(self, instances: list[InstanceView], length: Callable[[int], int] | None) -> list[Assign]:
        """The published scheduler (PolyRL state.rs): one request is a prompt's whole group, sent
        round-robin to an instance with nothing waiting (here: room for the whole group), never
        to one with a deadline. Rates and outstanding work are not looked at."""
        views = sorted((v for v in instances if v.accepts_new and v.time_left_s is None), key=lambda v: v.instance_id)
        load = {v.instance_id: len(self._by_instance.get(v.instance_id, ())) for v in views}
        placed: dict[str, list[int]] = {}
        while self._queue and views:
            gid = self._queue[0] // GROUP_STRIDE
            group = []
            while self._queue and self._queue[0] // GROUP_STRIDE == gid:
                group.append(self._queue.popleft())
            room = [v for v in views if load[v.instance_id] + len(group) <= v.capacity
                    and all(self.can_run(sid, v, length) for sid in group)]
            if not room:
                self._queue.extendleft(reversed(group))
                break
            target = room[self._turn % len(room)]
            self._turn += 1
            load[target.instance_id] += len(group)
            for sid in group:
                self.assign(sid, target.instance_id)
            placed.setdefault(target.instance_id, []).extend(group)
        return [Assign(iid, tuple(sids)) for iid, sids in sorted(placed.items())]

    @staticmethod
    def _keyed(open_: list[InstanceView], load: dict, need: float) -> list:
        heap = [((load[v.instance_id][1] + need) / v.rates.full_rate(v.capacity), load[v.instance_id][0],
                 v.instance_id, v) for v in open_ if load[v.instance_id][0] < v.capacity]
        heapq.heapify(heap)
        return heap

    @staticmethod
    def _pop_best(heap: list, load: dict) -> InstanceView | None:
        return heapq.heappop(heap)[3] if heap else None

    def _scan(self, sid: int, open_: list[InstanceView], load: dict, need: float, length, budget,
              position) -> InstanceView | None:
        """The open instance where the sample would finish its instance's work soonest."""
        best, best_key = None, None
        for v in open_:
            n, work = load[v.instance_id]
            if (n >= v.capacity or not self.can_run(sid, v, length)
                    or not self.fits(sid, v, n + 1, budget, position)):
                continue
            key = ((work + need) / v.rates.full_rate(v.capacity), n, v.instance_id)
            if best_key is None or key < best_key:
                best, best_key = v, key
        return best

    def steal(self, instances: list[InstanceView], remaining: Callable[[int], float],
              position: Callable[[int], int], length: Callable[[int], int] | None = None,
              budget: Callable[[int], int] | None = None) -> list[Move]:
        """Samples to move to free slots where they would finish clearly sooner (only with an empty
        queue); a target with a deadline takes only samples that fit (see dispatch). Decisions
        only: the caller assigns each sample once it has left its source."""
        if self._queue:
            return []
        cfg = self.config
        views = {v.instance_id: v for v in instances}
        count = {iid: len(self._by_instance.get(iid, ())) for iid in views}
        cache: dict[int, tuple[float, int]] = {}
        taken: set[int] = set()
        moves: dict[tuple[str, str], list[int]] = {}
        passed: set[str] = set()  # targets with a deadline that no sample fits
        made = 0
        while made < cfg.max_moves_per_tick:
            # the same sample gains most on the fastest free slot, so only that target matters
            # (unless none fits its deadline: then the next fastest is tried)
            targets = [v for v in instances if v.accepts_new and count[v.instance_id] < v.capacity
                       and v.instance_id not in passed]
            if not targets:
                break
            t = max(targets, key=lambda v: (v.rates.rate_at(count[v.instance_id] + 1), v.instance_id))
            t_rate = t.rates.rate_at(count[t.instance_id] + 1)
            best = None
            for src in sorted(self._by_instance):
                sids = self._by_instance[src]
                if src == t.instance_id or src not in views or not sids:
                    continue
                s_rate = views[src].rates.rate_at(count[src])
                if t_rate * (1.0 - cfg.steal_margin) <= s_rate:
                    continue  # no sample of src can clear the margin
                for sid in sids:
                    if (sid in taken or not self.can_run(sid, t, length)
                            or not self.fits(sid, t, count[t.instance_id] + 1, budget, position)):
                        continue
                    if sid not in cache:
                        cache[sid] = (remaining(sid), position(sid))
                    rem, pos = cache[sid]
                    stay = rem / s_rate
                    go = pos / cfg.prefill_tokens_per_s + rem / t_rate
                    gain = stay - go
                    if go < stay * (1.0 - cfg.steal_margin) and gain > cfg.min_steal_gain_s:
                        if best is None or (gain, -sid) > (best[0], -best[1]):
                            best = (gain, sid, src)
            if best is None:
                if t.time_left_s is None:
                    break
                passed.add(t.instance_id)
                continue
            made += 1
            _, sid, src = best
            taken.add(sid)
            count[src] -= 1
            count[t.instance_id] += 1
            moves.setdefault((src, t.instance_id), []).append(sid)
        return [Move(s, d, tuple(sorted(x))) for (s, d), x in sorted(moves.items())]
