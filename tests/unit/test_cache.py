import pytest
from prometheus_client import CollectorRegistry

from lens_ebpf.agent.config import FamilyLimits
from lens_ebpf.agent.metrics.cache import COUNTER, GAUGE, HISTOGRAM, CacheCollector, MetricCache
from lens_ebpf.core.exposition import render


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def registry_for(cache: MetricCache) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(CacheCollector(cache))
    return reg


def test_series_leaves_after_ttl_and_eviction_is_counted() -> None:
    clock = Clock()
    cache = MetricCache(ttl_seconds=60, max_series=10, clock=clock)
    cache.register("lens_x_total", COUNTER, "x", ("a",))
    cache.inc("lens_x_total", ("1",), 5)
    cache.inc("lens_x_total", ("2",), 7)
    reg = registry_for(cache)
    assert reg.get_sample_value("lens_x_total", {"a": "1"}) == 5
    clock.now += 30
    cache.inc("lens_x_total", ("2",), 1)  # refreshes series 2 only
    clock.now += 31
    assert reg.get_sample_value("lens_x_total", {"a": "1"}) is None
    assert reg.get_sample_value("lens_x_total", {"a": "2"}) == 8
    assert reg.get_sample_value("lens_agent_cache_evictions_total", {"family": "lens_x_total"}) == 1
    assert reg.get_sample_value("lens_agent_cache_series", {"family": "lens_x_total"}) == 1


def test_cap_refuses_new_series_but_keeps_updating_old_ones() -> None:
    clock = Clock()
    cache = MetricCache(ttl_seconds=60, max_series=3, clock=clock)
    cache.register("g", GAUGE, "g", ("k",))
    for i in range(3):
        assert cache.set("g", (str(i),), i)
    assert not cache.set("g", ("3",), 3)
    assert not cache.set("g", ("4",), 4)
    assert cache.set("g", ("0",), 42)
    reg = registry_for(cache)
    assert reg.get_sample_value("g", {"k": "0"}) == 42
    assert reg.get_sample_value("g", {"k": "3"}) is None
    assert reg.get_sample_value("lens_agent_cache_refused_total", {"family": "g"}) == 2
    assert reg.get_sample_value("lens_agent_cache_series", {"family": "g"}) == 3
    assert reg.get_sample_value("lens_agent_cache_max_series", {"family": "g"}) == 3
    # once old series expire there is room again
    clock.now += 61
    assert cache.set("g", ("3",), 3)
    assert reg.get_sample_value("lens_agent_cache_evictions_total", {"family": "g"}) == 3


def test_per_family_overrides() -> None:
    cache = MetricCache(60, 100, overrides={"f": FamilyLimits(max_series=1, ttl_seconds=5)})
    fam = cache.register("f", GAUGE, "f", ("k",))
    assert (fam.max_series, fam.ttl) == (1, 5)
    assert cache.register("other", GAUGE, "o").max_series == 100


def test_counters_only_go_up_and_keep_exact_names() -> None:
    cache = MetricCache()
    cache.register("primus_lens_network_flow_dns", COUNTER, "dns bytes")
    cache.register("lens_tcp_sent_bytes_total", COUNTER, "sent", ("raddr",))
    cache.inc("primus_lens_network_flow_dns", (), 10)
    cache.inc("primus_lens_network_flow_dns", (), 5)
    cache.inc("lens_tcp_sent_bytes_total", ("1.2.3.4",), 3)
    text = render([registry_for(cache)]).decode()
    assert "# TYPE primus_lens_network_flow_dns counter" in text
    assert "primus_lens_network_flow_dns 15.0" in text
    assert "# TYPE lens_tcp_sent_bytes_total counter" in text
    assert 'lens_tcp_sent_bytes_total{raddr="1.2.3.4"} 3.0' in text
    try:
        cache.inc("primus_lens_network_flow_dns", (), -1)
    except ValueError:
        pass
    else:
        raise AssertionError("negative increment accepted")


def test_histogram_is_cumulative_with_consistent_count_and_sum() -> None:
    cache = MetricCache()
    cache.register("h", HISTOGRAM, "h", ("d",), buckets=(1, 2, 5))
    cache.observe("h", ("x",), [1, 0, 2, 1], 12.5)
    cache.observe("h", ("x",), [0, 1, 0, 0], 1.5)
    reg = registry_for(cache)
    got = [
        reg.get_sample_value("h_bucket", {"d": "x", "le": le})
        for le in ("1.0", "2.0", "5.0", "+Inf")
    ]
    assert got == [1, 2, 4, 5]
    assert reg.get_sample_value("h_count", {"d": "x"}) == 5
    assert reg.get_sample_value("h_sum", {"d": "x"}) == 14.0


def test_label_count_mismatch_is_an_error() -> None:
    cache = MetricCache()
    cache.register("g", GAUGE, "g", ("a", "b"))
    try:
        cache.set("g", ("only-one",), 1)
    except ValueError as exc:
        assert "expected labels" in str(exc)
    else:
        raise AssertionError("accepted wrong labels")


def test_registering_does_not_collect() -> None:
    cache = MetricCache()
    collector = CacheCollector(cache)
    assert list(collector.describe()) == []


def test_budget_of_exposition_lines_refuses_new_series_and_counts_them() -> None:
    clock = Clock()
    cache = MetricCache(ttl_seconds=60, max_series=100, clock=clock, max_samples=10)
    cache.register("c_total", COUNTER, "c", ("k",))
    cache.register("h", HISTOGRAM, "h", ("k",), buckets=(1, 2))  # 3 buckets + 2: 5 lines
    assert cache.observe("h", ("a",), [1, 0, 0], 0.5)
    for i in range(5):
        assert cache.inc("c_total", (str(i),))
    assert cache.samples == 10
    assert not cache.inc("c_total", ("5",))  # an 11th line
    assert not cache.observe("h", ("b",), [0, 1, 0], 1.5)
    assert cache.inc("c_total", ("0",), 2)  # present series keep counting
    reg = registry_for(cache)
    assert reg.get_sample_value("c_total", {"k": "0"}) == 3
    assert reg.get_sample_value("lens_agent_cache_budget_refused_total", {"family": "c_total"}) == 1
    assert reg.get_sample_value("lens_agent_cache_budget_refused_total", {"family": "h"}) == 1
    assert reg.get_sample_value("lens_agent_cache_refused_total", {"family": "c_total"}) == 0
    assert reg.get_sample_value("lens_agent_cache_samples") == 10
    assert reg.get_sample_value("lens_agent_cache_max_samples") == 10
    # the histogram leaves after its TTL: its five lines are free again
    clock.now += 30
    for i in range(5):
        cache.inc("c_total", (str(i),))
    clock.now += 31
    assert cache.observe("h", ("b",), [0, 1, 0], 1.5)
    assert cache.samples == 10


def test_exposition_leaves_out_empty_labels_and_escapes_the_rest() -> None:
    cache = MetricCache()
    cache.register("g", GAUGE, "g", ("a", "b", "c"))
    cache.register("h", HISTOGRAM, "h", ("a", "b"), buckets=(1,))
    cache.set("g", ("x", "", 'q"\\\n'), 1)
    cache.set("g", ("", "", ""), 2)
    cache.observe("h", ("", "y"), [1, 1], 3.0)
    reg = registry_for(cache)
    first = render([reg]).decode()
    assert 'g{a="x",c="q\\"\\\\\\n"} 1.0\n' in first
    assert "\ng 2.0\n" in first
    assert 'h_bucket{b="y",le="1.0"} 1.0\nh_bucket{b="y",le="+Inf"} 2.0\n' in first
    assert 'h_count{b="y"} 2.0\nh_sum{b="y"} 3.0\n' in first
    # to Prometheus an empty label is no label: the samples API still names them all
    assert reg.get_sample_value("g", {"a": "", "b": "", "c": ""}) == 2
    cache.set("g", ("", "", ""), 5)
    again = render([reg]).decode()
    assert again == first.replace("\ng 2.0\n", "\ng 5.0\n")


def test_move_takes_a_series_whole_into_another() -> None:
    cache = MetricCache(max_series=3)
    cache.register("c_total", COUNTER, "c", ("k",))
    cache.register("d_total", COUNTER, "d", ())
    cache.register("h", HISTOGRAM, "h", ("k",), buckets=(1, 2))
    cache.inc("c_total", ("a",), 7)
    assert cache.move("c_total", ("a",), "c_total", ("b",))  # into a new series
    assert (cache.get("c_total", ("a",)), cache.get("c_total", ("b",))) == (None, 7)
    cache.inc("c_total", ("a",), 2)
    assert cache.move("c_total", ("a",), "c_total", ("b",))  # added to one there
    assert (cache.get("c_total", ("a",)), cache.get("c_total", ("b",))) == (None, 9)
    assert cache.move("c_total", ("b",), "d_total", ())  # into another family
    assert (cache.get("c_total", ("b",)), cache.get("d_total", ())) == (None, 9)
    assert not cache.move("c_total", ("b",), "d_total", ())  # gone: nothing twice
    assert cache.get("d_total", ()) == 9
    cache.observe("h", ("a",), [1, 0, 2], 3.5)
    cache.observe("h", ("b",), [0, 1, 0], 1.5)
    assert cache.move("h", ("a",), "h", ("b",))
    assert (cache.get("h", ("a",)), cache.get("h", ("b",))) == (None, ([1, 1, 2], 5.0))
    assert cache.samples == 1 + 5  # d_total's line, h's b
    # a target refused at its family's cap: nothing moves
    for k in "xyz":
        cache.inc("c_total", (k,))
    assert not cache.move("c_total", ("x",), "c_total", ("w",))
    assert cache.get("c_total", ("x",)) == 1 and cache.get("c_total", ("w",)) is None
    with pytest.raises(ValueError, match="counter"):
        cache.move("c_total", ("x",), "h", ("x",))
