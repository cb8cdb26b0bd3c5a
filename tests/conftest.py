"""Test-wide settings: keep Ray on loopback and small; tiny models on one torch thread."""

import compileall
import importlib.util
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Tiny models gain nothing from intra-op threads, and on a busy 2-core machine their
# spin-waiting costs several times the work itself (an engine thread shares the pool too).
_ONE_THREAD = ("rollout", "tasks", "trainer", "test_train_loop.py")


def pytest_configure(config):
    # The transfer tests drive the native core through its test hooks, which a wheel leaves out.
    if importlib.util.find_spec("rlboost._C") and not importlib.util.find_spec("rlboost._C_testing"):
        raise pytest.UsageError("rlboost._C_testing is not installed: the tests need the editable install "
                                "(pip install torch==2.13.0 -e '.[test]'), or a build with RLBOOST_TESTING_MODULE=ON")
    if not hasattr(config, "workerinput"):  # once, in the process that starts the workers
        _compile_the_package()
        gone = [name for name in _LONG_FIRST if not (Path(__file__).parent / name).is_file()]
        if gone:  # a renamed file would silently lose its place at the front
            raise pytest.UsageError(f"tests/conftest.py _LONG_FIRST names files that are not there: {gone}")


def _compile_the_package() -> None:
    """Write the package's bytecode before any process of the session imports it. The tests
    run the editable install from the source tree, and where PYTHONDONTWRITEBYTECODE is set
    (it is on the 2-core reference machine) no process writes it: every one a whole run starts
    (the driver, the trainer ranks, the controller, each instance) would compile the sources
    it imports again. Python reads bytecode that is there whatever that variable says.
    __pycache__ is ignored by git."""
    compileall.compile_dir(Path(importlib.util.find_spec("rlboost").origin).parent, quiet=1)


@pytest.fixture(scope="session", autouse=True)
def starting_weights_cache(tmp_path_factory):
    """One RLBOOST_CACHE for the session, shared by both workers: the starting checkpoints a
    run builds (a tiny model and its supervised warm-up steps, tens of seconds on 2 cores) are
    keyed by every setting they depend on and installed atomically, as for concurrent runs,
    so each whole run of a recipe reuses the one built first. A test of the cache itself sets
    its own."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # xdist: <session>/popen-gwN
    patch = pytest.MonkeyPatch()
    patch.setenv("RLBOOST_CACHE", str(root / "rlboost-cache"))
    yield root / "rlboost-cache"
    patch.undo()


@pytest.fixture
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# Files that take ten seconds or more (whole runs, Ray clusters of their own, two-rank
# trainers), longest first, as measured in quiet runs of the suite on 2 cores. They are
# collected first: two workers take the first files in turn and then the rest as they free
# up, so the long ones are shared out early and the suite ends on short files, not with one
# worker alone on a long one while the other idles. Within a module the order is kept.
_LONG_FIRST = ("test_train_cli.py", "cluster/test_live_capacity.py", "test_train_emulated.py", "bench/test_bench_smoke.py",
               "test_supervision.py", "tasks/test_own_task_run.py", "test_two_nodes.py", "cluster/test_fleet.py",
               "test_outsider.py", "test_train_transformers.py", "cluster/test_fleet_events.py",
               "tasks/test_hostile_run.py", "cluster/test_egress_run.py", "cluster/test_instance_agent.py",
               "bench/test_paper_table_smoke.py", "cluster/test_fleet_deaths.py", "controller/test_actor.py",
               "trainer/test_rank_rng.py", "rollout/test_handoff.py", "trainer/test_fsdp_two_ranks.py",
               "transfer/test_idle_sources.py", "test_multi_node.py", "cluster/test_hostile_metadata.py",
               "sim/test_simulate_cli.py", "trainer/test_exactness_two_ranks.py", "transfer/test_relay.py",
               "test_cli_errors.py", "transfer/test_resume.py", "environments/test_host_actor.py",
               "bench/test_transfer_bench_smoke.py")


# Files whose tests need a local Ray cluster and nothing of its start (none of them starts a
# run, whose RaySession would join it): they share one that offers what each module's own
# RaySession asks for (which finds it up and leaves it up), one start instead of five, some
# 9 CPU-seconds each on 2 cores. They go to one worker as one unit of work
# (pytest_xdist_make_scheduler), one after the other, and the cluster stops after the last
# of their tests.
_ONE_RAY = ("cluster/test_fleet.py", "cluster/test_fleet_events.py", "cluster/test_fleet_deaths.py",
            "cluster/test_instance_agent.py", "controller/test_actor.py")
_ONE_RAY_SETTINGS = dict(num_cpus=2, reserved=2, preemptible=4, object_store_mb=200)
_one_ray = None  # its RaySession while open


def _in_one_ray(item) -> bool:
    root = Path(__file__).parent
    path = Path(item.fspath)
    return path.is_relative_to(root) and path.relative_to(root).as_posix() in _ONE_RAY


@pytest.fixture(scope="module")
def one_ray(starting_weights_cache):
    """Set up first for the tests of the _ONE_RAY files (after the session's settings, which
    the cluster's workers inherit); stopped by pytest_runtest_teardown after the last of them."""
    global _one_ray
    if _one_ray is None:
        from rlboost.cluster.session import RaySession, RaySettings

        _one_ray = RaySession(RaySettings(**_ONE_RAY_SETTINGS)).__enter__()
    yield


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    global _one_ray
    if _one_ray is not None and (nextitem is None or not _in_one_ray(nextitem)):
        _one_ray.__exit__()
        _one_ray = None


@pytest.hookimpl(optionalhook=True)  # xdist's hook: `-p no:xdist` runs without it
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None  # xdist's own
    from xdist.scheduler import LoadFileScheduling

    class OneRayTogether(LoadFileScheduling):
        """loadfile, with the _ONE_RAY files as one unit."""

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "one-ray" if any(path.endswith("tests/" + name) for name in _ONE_RAY) else path

    return OneRayTogether(config, log)


def pytest_collection_modifyitems(config, items):
    root = Path(__file__).parent
    rank = {name: i for i, name in enumerate(_LONG_FIRST)}
    for name in _ONE_RAY:  # together, where the first of them stands
        rank[name] = min(rank.get(n, len(_LONG_FIRST)) for n in _ONE_RAY) + _ONE_RAY.index(name) / len(_ONE_RAY)
    for item in items:
        path = Path(item.fspath)
        if path.is_relative_to(root) and path.relative_to(root).parts[0] in _ONE_THREAD:
            item.fixturenames.insert(0, "one_torch_thread")
        if _in_one_ray(item):
            item.fixturenames.insert(0, "one_ray")

    def first(item) -> int:
        path = Path(item.fspath)
        return rank.get(path.relative_to(root).as_posix(), len(rank)) if path.is_relative_to(root) else len(rank)

    items.sort(key=first)  # stable: every other module keeps its place and order
