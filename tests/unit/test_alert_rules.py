"""Log rules (lens_ebpf/recorder/alerts/logrules.py) on real framework lines: the shipped
templates fire on what breaks GPU training and on nothing a healthy run prints; the
engine fires one alert per rule and workload (not per rank), suppresses what repeats
within repeat_interval (counted), counts a threshold over its window, and reads both
dialects of a rule's config."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from lens_ebpf.recorder.alerts import logrules
from lens_ebpf.recorder.alerts.logrules import Line, LogRules, compile_pattern
from lens_ebpf.recorder.alerts.logtemplates import TEMPLATES
from lens_ebpf.recorder.errors import BadRequest, Conflict
from lens_ebpf.recorder.store.writer import engine_for, upgrade

FIX = Path(__file__).parent.parent / "fixtures" / "training"
T0 = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
HEALTHY = (
    "megatron-single-node.log",
    "primus.log",
    "torchtitan.log",
    "hf_trainer.log",
    "deepspeed.log",
)


def fired_templates(text: str) -> list[str]:
    """The templates whose pattern is in text; each template's keywords (the engine's
    cheap test first) never turn away a line its pattern matches."""
    out = []
    for t in TEMPLATES:
        cfg = t["template_config"]["match_config"]
        if compile_pattern(cfg["pattern"], cfg).search(text):
            assert any(k in text.lower() for k in cfg["keywords"]), (t["name"], text)
            out.append(t["name"])
    return out


@pytest.mark.parametrize("name", HEALTHY)
def test_no_shipped_template_fires_on_a_healthy_runs_lines(name: str) -> None:
    """Megatron's "number of nan iterations: 0", a loss scale, HF's dicts: none fire."""
    for line in (FIX / name).read_text().splitlines():
        assert fired_templates(line) == [], line


def test_the_nccl_watchdog_lines_fire_the_watchdog_template_alone() -> None:
    lines = (FIX / "nccl-timeout.log").read_text().splitlines()
    got = [fired_templates(x) for x in lines]
    assert got == [["NCCL-RCCL-Watchdog-Timeout"]] * 3 + [[]] + [["NCCL-RCCL-Watchdog-Timeout"]]


@pytest.mark.parametrize(
    ("text", "template"),
    [
        (" iteration 7/ 5000 | lm loss: NAN | loss scale: 1.0 |", "Training-Loss-NaN-Inf"),
        (
            "{'loss': nan, 'grad_norm': 1.2, 'learning_rate': 2e-05, 'epoch': 0.1}",
            "Training-Loss-NaN-Inf",
        ),
        ("{'loss': 2.1, 'grad_norm': inf}", "Training-Loss-NaN-Inf"),
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
            "total capacity of 79.10 GiB",
            "CUDA-Out-Of-Memory",
        ),
        (
            "HIP out of memory. Tried to allocate 1.95 GiB. "
            "GPU 3 has a total capacity of 191.98 GiB",
            "HIP-Out-Of-Memory",
        ),
        ("NVRM: Xid (PCI:0000:31:00): 79, pid=1234, GPU has fallen off the bus.", "GPU-Xid"),
        (
            "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
            "ProcessGroupNCCL.cpp:1970, unhandled system error",
            "NCCL-RCCL-Error",
        ),
        ("Fatal Python error: Segmentation fault", "Collective-Segfault"),
    ],
)
def test_each_training_failure_fires_its_template(text: str, template: str) -> None:
    assert template in fired_templates(text)


def test_every_shipped_template_has_keywords() -> None:
    """The engine tests a rule's keywords before its pattern: the nine default patterns
    searched in every line cost several times more (bench.log_rules, BENCHMARKS.md)."""
    assert all(t["template_config"]["match_config"]["keywords"] for t in TEMPLATES)


# -- the engine -------------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def rule(conn: Any, **fields: Any) -> int:
    body = {
        "name": "r",
        "cluster_name": "",
        "match_type": "pattern",
        "match_config": {"pattern": "Watchdog caught"},
        "repeat_interval": 600,
        **fields,
    }
    return logrules.create_rule(conn, body, T0, "test")


def line(pod: str, text: str, at: datetime, workload: str = "w-uid") -> Line:
    return Line(
        at,
        text,
        "ml",
        pod,
        f"uid-{pod}",
        "main",
        f"node-{pod}",
        workload,
        "bert",
        "PyTorchJob",
        "home",
    )


@pytest.fixture()
def engine(tmp_path: Path) -> Any:
    eng = engine_for(f"sqlite:///{tmp_path / 'r.db'}")
    upgrade(eng)
    yield eng
    eng.dispose()


def test_ranks_of_one_workload_fire_once_and_repeats_are_counted(engine: Any) -> None:
    with engine.begin() as conn:
        rid = rule(conn)
    clock = Clock()
    rules = LogRules(engine, 3600, clock)
    ranks = [
        line(
            f"bert-worker-{i}",
            f"[rank{i}] Watchdog caught collective operation timeout",
            T0 + timedelta(seconds=i),
        )
        for i in range(8)
    ]
    fired = rules.evaluate(ranks)
    assert len(fired) == 1
    a = fired[0]
    assert (a.alert_name, a.severity, a.source) == ("r", "warning", "log")
    assert a.labels["workload"] == "bert" and a.labels["workload_uid"] == "w-uid"
    assert a.labels["pod"] == "bert-worker-0" and a.labels["rule_id"] == str(rid)
    c = rules.counts
    assert (c.evaluated, c.matched, c.fired, c.suppressed) == (8, 8, 1, 7)
    # another workload's line is its own alert; the first's, within 600 s, is not
    other = rules.evaluate(
        [
            line("gpt-0", "Watchdog caught", T0 + timedelta(seconds=30), "w2"),
            line("bert-worker-1", "Watchdog caught", T0 + timedelta(seconds=599)),
        ]
    )
    assert [x.labels["workload_uid"] for x in other] == ["w2"]
    again = rules.evaluate([line("bert-worker-2", "Watchdog caught", T0 + timedelta(seconds=600))])
    assert len(again) == 1 and again[0].id != a.id
    assert (c.fired, c.suppressed) == (3, 8)
    with engine.connect() as conn:
        row = conn.execute(logrules.t.log_alert_rules.select()).first()
    assert row is not None and (row.trigger_count, row.last_triggered_at) == (
        3,
        (T0 + timedelta(seconds=600)).replace(tzinfo=None),
    )  # the firings, the last


def test_a_threshold_fires_at_its_count_within_its_window(engine: Any) -> None:
    with engine.begin() as conn:
        rule(
            conn,
            match_type="threshold",  # the pages' dialect
            match_config={
                "pattern": "out of memory",
                "flags": {"case_insensitive": True},
                "threshold": {"count": 3, "window": "1m"},
            },
        )
    rules = LogRules(engine, 3600, Clock())
    # 0, 50: two; 70: 0 has left the window (70 s), two again; 100: 50, 70, 100 fire;
    # 110: four in the window, within repeat_interval (suppressed)
    got = [
        len(rules.evaluate([line("p", "CUDA Out Of Memory", T0 + timedelta(seconds=s))]))
        for s in (0, 50, 70, 100, 110)
    ]
    assert got == [0, 0, 0, 1, 0]
    assert (rules.counts.matched, rules.counts.fired, rules.counts.suppressed) == (5, 1, 1)


def test_selectors_in_both_dialects(engine: Any) -> None:
    with engine.begin() as conn:
        rule(
            conn, name="ui", label_selectors=[{"key": "namespace", "operator": "=", "value": "ml"}]
        )
        rule(
            conn,
            name="engine",
            label_selectors=[
                {"type": "pod", "key": "pod_name", "operator": "regex", "values": ["train-.*"]}
            ],
        )
        rule(
            conn,
            name="none",
            label_selectors=[{"key": "namespace", "operator": "!=", "value": "ml"}],
        )
    rules = LogRules(engine, 3600, Clock())
    names = sorted(a.alert_name for a in rules.evaluate([line("train-3", "Watchdog caught", T0)]))
    assert names == ["engine", "ui"]


def test_bad_rules_are_refused_with_the_field_named(engine: Any) -> None:
    with engine.begin() as conn:
        rule(conn)
        with pytest.raises(Conflict):
            rule(conn)
        for bad, field in (
            ({"match_config": {"pattern": "("}}, "pattern"),
            ({"match_type": "sql"}, "match_type"),
            ({"label_selectors": [{"key": "pod", "operator": "~~"}]}, "operator"),
            ({"group_by": ["rack"]}, "group_by"),
            ({"repeat_interval": "soon"}, "repeat_interval"),
            ({"match_config": {"pattern": "x", "keywords": "x"}}, "keywords"),
            ({"name": ""}, "name"),
        ):
            with pytest.raises(BadRequest, match=field):
                rule(conn, **{"name": "x", **bad})


def test_the_pattern_tester_answers_as_the_page_reads() -> None:
    got = logrules.test_pattern(
        {
            "pattern": r"rank(\d+).*timeout",
            "sample_log": "[rank3] collective TIMEOUT",
            "flags": {"case_insensitive": True},
        }
    )
    assert got == {"matched": True, "captures": ["3"]}
    assert logrules.test_pattern({"pattern": "x", "sample_log": "y"}) == {
        "matched": False,
        "captures": [],
    }
    with pytest.raises(BadRequest, match="pattern"):
        logrules.test_pattern({"pattern": "(", "sample_log": "y"})


def test_keywords_are_tested_before_the_pattern(engine: Any) -> None:
    with engine.begin() as conn:
        rule(conn, match_config={"pattern": "caught", "keywords": ["WatchDog"]})
    rules = LogRules(engine, 3600, Clock())
    assert rules.evaluate([line("p", "caught it", T0)]) == []
    assert len(rules.evaluate([line("q", "WATCHDOG caught it", T0)])) == 1
    assert (rules.counts.evaluated, rules.counts.matched) == (2, 1)
