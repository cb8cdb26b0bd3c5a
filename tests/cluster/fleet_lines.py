"""The fleet's event lines as a test sees them (the driver writes them to events.jsonl)."""

import threading


class FleetLinesForTests:
    """Stands in for the run's events.jsonl writer: keeps every line; wait(kind, instance)
    blocks until the instance has a line of that kind, first(predicate) until some line
    matches (returned), of(instance, kind) lists its lines."""

    def __init__(self):
        self.lines, self._cond = [], threading.Condition()

    def __call__(self, kind, **fields):
        with self._cond:
            self.lines.append({"kind": kind, **fields})
            self._cond.notify_all()

    def wait(self, kind, instance, timeout=120.0):
        with self._cond:
            assert self._cond.wait_for(lambda: self.of(instance, kind), timeout), \
                f"no {kind} line for {instance}: {self.lines}"

    def first(self, predicate, timeout=120.0):
        """The first line predicate(line) holds for, once there is one."""
        with self._cond:
            assert self._cond.wait_for(lambda: any(predicate(e) for e in self.lines), timeout), self.lines
            return next(e for e in self.lines if predicate(e))

    def of(self, instance, kind=None):
        return [e for e in self.lines if e.get("instance") == instance and kind in (None, e["kind"])]
