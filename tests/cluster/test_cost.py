"""Cost ledger arithmetic."""

import threading

import pytest

from rlboost.cluster.cost import CostConfig, CostLedger


def test_instance_hours_at_default_prices():
    ledger = CostLedger()
    ledger.start("trainer", "reserved", at_s=0.0)
    ledger.start("spot-0", "preemptible", at_s=600.0)
    ledger.start("spot-1", "preemptible", at_s=600.0)
    ledger.stop("spot-0", at_s=2400.0)            # 1800 s
    s = ledger.summary(at_s=7200.0)                # spot-1 still up: 6600 s
    assert s.reserved_s == 7200.0 and s.preemptible_s == 1800.0 + 6600.0
    assert s.reserved_usd == pytest.approx(2 * 83.79)
    assert s.preemptible_usd == pytest.approx(8400.0 / 3600.0 * 21.28)
    assert s.total_usd == pytest.approx(167.58 + 49.653333)
    assert ledger.running() == {"trainer": "reserved", "spot-1": "preemptible"}


def test_tokens_per_dollar_and_time_scale():
    # One trace hour replayed per minute: 60 ledger seconds bill as one hour.
    ledger = CostLedger(CostConfig(reserved_usd_per_hour=10.0, preemptible_usd_per_hour=2.0,
                                   time_scale=60.0))
    ledger.start("r", "reserved", at_s=0.0)
    ledger.start("p", "preemptible", at_s=0.0)
    ledger.add_tokens(6_000)
    ledger.add_tokens(6_000)
    s = ledger.summary(at_s=60.0)
    assert s.reserved_s == 3600.0 and s.total_usd == pytest.approx(12.0)
    assert ledger.tokens_per_dollar(at_s=60.0) == pytest.approx(1000.0)
    assert CostLedger().tokens_per_dollar(at_s=0.0) == 0.0  # nothing spent yet


def test_spot_capacity_raises_tokens_per_dollar_when_it_adds_throughput():
    # Paper-style comparison: on-demand only vs the same node plus two spot nodes that
    # double throughput; tokens per dollar rise because spot is ~4x cheaper.
    only = CostLedger()
    only.start("r", "reserved", at_s=0.0)
    only.add_tokens(10_000 * 3600)
    mixed = CostLedger()
    mixed.start("r", "reserved", at_s=0.0)
    mixed.start("p0", "preemptible", at_s=0.0)
    mixed.start("p1", "preemptible", at_s=0.0)
    mixed.add_tokens(20_000 * 3600)
    gain = mixed.tokens_per_dollar(at_s=3600.0) / only.tokens_per_dollar(at_s=3600.0)
    assert gain == pytest.approx(2 * 83.79 / (83.79 + 2 * 21.28))


def test_concurrent_updates_are_not_lost():
    ledger = CostLedger()

    def work(k):
        for i in range(200):
            ledger.start(f"{k}-{i}", "preemptible", at_s=0.0)
            ledger.stop(f"{k}-{i}", at_s=1.0)
            ledger.add_tokens(1)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = ledger.summary(at_s=1.0)
    assert s.preemptible_s == 800.0 and s.tokens == 800


def test_misuse_is_rejected():
    ledger = CostLedger()
    ledger.start("a", "reserved", at_s=5.0)
    with pytest.raises(ValueError, match="already running"):
        ledger.start("a", "reserved", at_s=6.0)
    with pytest.raises(ValueError, match="before its start"):
        ledger.stop("a", at_s=4.0)
    with pytest.raises(ValueError, match="not running"):
        ledger.stop("b", at_s=6.0)
    with pytest.raises(ValueError, match="kind"):
        ledger.start("c", "spot", at_s=0.0)
    with pytest.raises(ValueError, match="n must"):
        ledger.add_tokens(-1)


@pytest.mark.parametrize("kwargs,field", [
    ({"reserved_usd_per_hour": -1.0}, "reserved_usd_per_hour"),
    ({"preemptible_usd_per_hour": -0.1}, "preemptible_usd_per_hour"),
    ({"time_scale": 0.0}, "time_scale")])
def test_config_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        CostConfig(**kwargs)


def test_egress_is_priced_per_pool_and_counts_in_tokens_per_dollar():
    prices = CostConfig(reserved_usd_per_hour=0.0, preemptible_usd_per_hour=3600.0,  # $1 per second
                        egress_usd_per_gb={"preemptible": 0.09})
    ledger = CostLedger(prices)
    ledger.start("spot-0", "preemptible", at_s=0.0)
    ledger.add_tokens(1000)
    ledger.add_egress("preemptible", 20_000_000_000)  # 20 GB from the trainer's region
    ledger.add_egress("reserved", 50_000_000_000)     # same zone: free by default
    s = ledger.summary(at_s=10.0)
    assert s.egress_bytes == 70_000_000_000 and s.egress_usd == pytest.approx(1.8)
    assert s.total_usd == pytest.approx(10.0 + 1.8)
    assert s.tokens_per_dollar == pytest.approx(1000 / 11.8)


def test_egress_carries_across_a_resume_and_old_totals_still_load():
    prices = CostConfig(egress_usd_per_gb={"reserved": 0.01, "preemptible": 0.05})
    first = CostLedger(prices)
    first.add_egress("preemptible", 10**9)
    resumed = CostLedger(prices)
    resumed.carry(first.totals(at_s=0.0))
    resumed.carry({"seconds": {"reserved": 1.0}, "tokens": 5})  # a checkpoint from before egress was counted
    resumed.add_egress("reserved", 10**9)
    assert resumed.summary(at_s=0.0).egress_usd == pytest.approx(0.06)


@pytest.mark.parametrize("prices", [{"spot": 0.1}, {"preemptible": -0.1}, {"preemptible": "0.1"}, [0.1]])
def test_egress_prices_must_name_pools_and_be_non_negative(prices):
    with pytest.raises(ValueError, match="egress_usd_per_gb"):
        CostConfig(egress_usd_per_gb=prices)


def test_egress_of_an_unknown_pool_or_negative_bytes_is_refused():
    ledger = CostLedger()
    with pytest.raises(ValueError, match="kind"):
        ledger.add_egress("spot", 1)
    with pytest.raises(ValueError, match="nbytes"):
        ledger.add_egress("preemptible", -1)
