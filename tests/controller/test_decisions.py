"""StepDecisions over a fake engine table: the actions they return for the local window,
placement and a step that cannot finish. Nothing is carried out here; that is the service's."""

from table_fakes import FakeScene

from rlboost.controller.config import ControllerConfig
from rlboost.controller.decisions import AskForReserved, CloseWindow, FailStep, ReopenWindow, RolloutDone, StepDecisions
from rlboost.controller.estimates import LengthModel, RateModel
from rlboost.controller.router import RouterConfig
from rlboost.errors import StepFailed
from rlboost.sim import make_groups

GROUPS = make_groups(0, num_groups=2, group_size=2, prompt_len=4, max_new_tokens=60)
SIDS = [sid for g in GROUPS for sid in g.sample_ids]


class WindowPolicyFake:
    """Says to close the window when close is True; counts how often it was asked."""

    def __init__(self, close: bool):
        self.close, self.asked = close, 0

    def plan(self, ctx) -> float:
        return 0.0

    def should_close(self, ctx) -> bool:
        self.asked += 1
        return self.close

    def observe(self, obs) -> None:
        pass


def decisions(scene: FakeScene, *, close: bool = False, config: ControllerConfig | None = None) -> StepDecisions:
    return StepDecisions(config or ControllerConfig(), scene.clock, table=scene.table, registry=scene.registry,
                         router=scene.router, lengths=LengthModel(), policy=WindowPolicyFake(close))


def test_the_window_closes_when_the_policy_says_so_and_names_the_reserved_instances_to_empty():
    scene = FakeScene(GROUPS)
    scene.add("reserved-0", "reserved")
    scene.add("spot-0")
    scene.add("spot-1")
    assert decisions(scene, close=True).window(scene.step) == CloseWindow(num_preemptible=2, evacuate=("reserved-0",))
    assert decisions(scene, close=False).window(scene.step) is None


def test_the_window_stays_open_while_a_sample_fits_only_on_the_reserved_instance():
    scene = FakeScene(GROUPS)
    scene.add("reserved-0", "reserved")
    scene.add("spot-0", max_model_len=32)  # prompt 4 + 60 new tokens cannot fit
    assert decisions(scene, close=True).window(scene.step) is None


def test_the_policy_is_not_asked_without_a_preemptible_instance_to_take_the_rest():
    scene = FakeScene(GROUPS)
    scene.add("reserved-0", "reserved")
    d = decisions(scene, close=True)
    assert d.window(scene.step) is None and d.policy.asked == 0


def test_samples_only_the_reserved_instances_can_run_reopen_the_window_or_ask_the_trainer_for_them():
    scene = FakeScene(GROUPS)
    scene.add("reserved-0", "reserved")
    st = scene.step
    st.window_open = False  # closed, and every preemptible instance has gone since
    d = decisions(scene)
    assert d.window(st) == ReopenWindow()  # the trainer was not told they are free yet
    st.handed_over = True
    assert d.window(st) == AskForReserved()
    st.reserved_needed = True
    assert d.window(st) is None  # asked once


def test_placement_skips_the_reserved_instances_once_the_window_is_closed():
    scene = FakeScene(GROUPS)
    scene.add("reserved-0", "reserved", capacity=4)
    scene.add("spot-0", capacity=2)
    scene.step.window_open = False
    placed = decisions(scene).dispatch(scene.step)
    assert [(a.instance_id, len(a.sample_ids)) for a in placed] == [("spot-0", 2)]
    assert len(scene.router.queued) == 2  # the rest waits for a free slot


def test_a_draining_instance_gets_no_samples_before_its_rate_has_been_measured():
    scene = FakeScene(GROUPS)
    scene.add("spot-0", rates=RateModel(30.0, 1000.0))
    scene.registry.notice("spot-0", 3600.0)
    d = decisions(scene)
    assert d.dispatch(scene.step) == []
    scene.table.rates("spot-0").observed = True
    assert [a.instance_id for a in d.dispatch(scene.step)] == ["spot-0"]


def test_check_reports_a_finished_rollout_once():
    scene = FakeScene(GROUPS)
    scene.add("spot-0")
    for sid in SIDS:
        scene.collect(sid, 3, "stop")
    d = decisions(scene)
    assert d.check(scene.step) == RolloutDone(num_preemptible=1)
    scene.step.rollout_done(scene.clock.now(), 1)
    assert d.check(scene.step) is None


def test_check_fails_a_step_without_a_token_for_idle_timeout_s_naming_the_missing_samples():
    scene = FakeScene(GROUPS)
    scene.add("spot-0")
    d = decisions(scene, config=ControllerConfig(idle_timeout_s=10.0))
    scene.clock.advance(9.0)
    assert d.check(scene.step) is None
    scene.clock.advance(2.0)
    action = d.check(scene.step)
    assert isinstance(action, FailStep) and isinstance(action.error, StepFailed)
    assert "idle_timeout_s=10.0" in str(action.error) and set(action.error.missing) == set(SIDS)


def test_check_fails_a_step_whose_sample_lost_its_instance_more_often_than_the_retry_budget():
    config = ControllerConfig(router=RouterConfig(retry_budget=1))
    scene = FakeScene(GROUPS, router=config.router)
    scene.add("spot-0")
    d = decisions(scene, config=config)
    scene.router.requeue([SIDS[0]], failed=True)
    assert d.check(scene.step) is None
    scene.router.requeue([SIDS[0]], failed=True)
    action = d.check(scene.step)
    assert isinstance(action, FailStep) and "retry_budget=1" in str(action.error)
