"""A process forked while a publisher serves (a data-loader worker, a subprocess helper)
may close the copy it inherited: the parent's server keeps serving."""

import os
import threading

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
