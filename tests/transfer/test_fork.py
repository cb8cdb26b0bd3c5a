"""A process forked while a publisher serves (a data-loader worker, a subprocess helper)
may close the copy it inherited: the parent's server keeps serving."""

import os
import threading

from rlboost.errors import TransferError
from rlboost.migration.state import RequestState, SamplingParams, pack_states
from rlboost.transfer import WeightPublisher, WeightPuller

from .helpers import assert_same, make_config, random_tensors

SHORT = 10.0


def _in_child(pub: WeightPublisher) -> None:
    """Uses the native thread pool, then closes the inherited publisher."""
    code = 1
    try:
        state = RequestState(sample_id=1, prompt_ids=(1, 2), params=SamplingParams(), seed=1, weight_version=1)
        pack_states([state] * 2000)
        pub.close()
        code = 0
    finally:
        os._exit(code)


def _wait_child(pid: int) -> int | None:
    """The child's exit status, or None when it has not exited within SHORT seconds."""
    result: list[int] = []
    waiter = threading.Thread(target=lambda: result.append(os.waitpid(pid, 0)[1]), daemon=True)
    waiter.start()
    waiter.join(SHORT)
    return result[0] if result else None


def test_a_forked_child_that_closes_its_publisher_leaves_the_parent_serving():
    tensors = random_tensors(13)
    with WeightPublisher(make_config()) as pub:
        pub.publish(1, tensors)
        pid = os.fork()
        if pid == 0:
            _in_child(pub)
        status = _wait_child(pid)
        if status is None:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        assert status == 0
        with WeightPuller(pub.address, make_config(transport="tcp", relay=False)) as puller:
            assert_same(puller.pull(1, timeout=SHORT), tensors)


def _pull_in_child(puller: WeightPuller, tensors) -> None:
    """Pulls through the parent's puller; exits 0 with the right bytes, 3 on a typed error."""
    code = 1
    try:
        try:
            assert_same(puller.pull(1, timeout=SHORT), tensors)
            code = 0
        except TransferError:
            code = 3
    finally:
        os._exit(code)


def test_a_forked_child_pulling_through_its_parents_puller_never_speaks_on_its_connections():
    # The parent keeps its authenticated connections between pulls. A child that used them
    # would sign (or seal) a frame under the parent's keys and counters, which the parent
    # then signs again: the source refuses the parent's next request (a replay, to it).
    tensors = random_tensors(13)
    with WeightPublisher(make_config()) as pub:
        pub.publish(1, tensors)
        with WeightPuller(pub.address, make_config(transport="tcp", relay=False)) as puller:
            assert_same(puller.pull(1, timeout=SHORT), tensors)
            pid = os.fork()
            if pid == 0:
                _pull_in_child(puller, tensors)
            status = _wait_child(pid)
            if status is None:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            assert status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) in (0, 3), status
            pulled = puller.pull(1, timeout=SHORT)
            assert_same(pulled, tensors)
        stats = pub.stats()
    assert stats["auth_failures"] == 0 and stats["protocol_errors"] == 0, stats
