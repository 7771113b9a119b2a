"""Training progress lines (each format's real lines, every field), what shippers POST,
the regression rule and the outlier rule: pure code, no service."""

from __future__ import annotations

import gzip
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from lens_ebpf.recorder.training import formats
from lens_ebpf.recorder.training.formats import Progress, parse
from lens_ebpf.recorder.training.logs import BodyError, LogLine, gunzip, parse_body
from lens_ebpf.recorder.training.outliers import Flag, robust_outliers
from lens_ebpf.recorder.training.timeline import Regression, regressions

FIX = Path(__file__).parent.parent / "fixtures" / "training"
# megatron-single-node.log's ten iterations, in seconds
MEGATRON_SECONDS = [
    19.1388,
    12.9361,
    12.9781,
    13.0141,
    13.076,
    13.0747,
    13.0818,
    13.0687,
    13.0712,
    13.0654,
]


def lines(name: str) -> list[str]:
    return (FIX / name).read_text().splitlines()


def test_megatron_every_iteration_line_of_a_real_run() -> None:
    got = [p for p in map(parse, lines("megatron-single-node.log")) if p is not None]
    assert [p.iteration for p in got] == list(range(1, 11))
    assert got[0] == Progress(
        "megatron",
        iteration=1,
        target_iterations=5000,
        iteration_seconds=19.1388,
        tflops_per_gpu=80.2,
        loss=10.43863,
        skipped_iterations=0,
        nan_iterations=0,
    )
    assert [p.iteration_seconds for p in got] == MEGATRON_SECONDS
    assert got[-1].loss == 9.947481 and got[-1].tflops_per_gpu == 117.6
    assert all(p.tokens_per_second is None for p in got)  # Megatron prints none


def test_primus_line_with_colors_and_current_average_pairs() -> None:
    (line,) = lines("primus.log")
    assert "\x1b[32m" in line
    assert parse(line) == Progress(
        "megatron",
        iteration=12125,
        target_iterations=36000,
        iteration_seconds=2.7013,
        tokens_per_second=12130.4,
        tflops_per_gpu=210.5,
        loss=2.352391,
        skipped_iterations=0,
        nan_iterations=0,
    )


def test_torchtitan_lines() -> None:
    got = [parse(line) for line in lines("torchtitan.log")]
    assert got == [
        Progress(
            "torchtitan",
            iteration=1,
            loss=12.2254,
            tokens_per_second=375.0,
            tflops_per_gpu=21.73,
            derive_seconds=True,
        ),
        Progress(
            "torchtitan",
            iteration=10,
            loss=10.7069,
            tokens_per_second=7034.0,
            tflops_per_gpu=407.35,
            derive_seconds=True,
        ),
        Progress(
            "torchtitan",
            iteration=530,
            loss=5.9866,
            tokens_per_second=829.0,
            tflops_per_gpu=23.15,
            derive_seconds=True,
        ),
    ]
    colored = "\x1b[31mstep: 10  \x1b[32mloss: 10.7069  \x1b[34mtps: 7,034  \x1b[36mtflops: 407.35"
    assert parse(colored) == got[1]


def test_hugging_face_trainer_lines() -> None:
    got = [parse(line) for line in lines("hf_trainer.log")]
    assert got[:3] == [
        Progress("hf_trainer", loss=v, derive_seconds=True) for v in (0.1841, 0.1784, 0.1846)
    ]
    assert got[3] == Progress(
        "hf_trainer", iteration_seconds=1 / 1.226, loss=0.3935928952693939, samples_per_second=4.903
    )
    assert got[4] == Progress("hf_trainer", loss=2.205, derive_seconds=True)  # quoted values
    assert got[5] is None  # an evaluation is not training progress
    with_step = (
        "{'loss': 0.7694, 'grad_norm': 5.42, 'learning_rate': 0.000981, 'epoch': 2.0, "
        "'step': 200}"
    )
    assert parse(with_step) == Progress(
        "hf_trainer", iteration=200, loss=0.7694, derive_seconds=True
    )


def test_deepspeed_lines() -> None:
    got = [parse(line) for line in lines("deepspeed.log")]
    assert got == [
        Progress("deepspeed", iteration=30, skipped_iterations=20),
        Progress(
            "deepspeed",
            iteration=30,
            loss=10.7133,
            iteration_seconds=0.283,
            samples_per_second=226.457,
        ),
        Progress(
            "deepspeed",
            iteration=100,
            loss=0.0585,
            iteration_seconds=0.186,
            samples_per_second=53.694,
        ),
        Progress(
            "deepspeed",
            iteration=200,
            loss=5.5508,
            iteration_seconds=0.936,
            samples_per_second=136.706,
        ),
    ]


@pytest.mark.parametrize(
    "line",
    [
        "",
        "hello",
        "iteration 5 of many",
        "{'learning_rate': 0.1}",
        "step: 3  loss: 1.0",
        " iteration   1/ 10 | lm loss: nan | elapsed time per iteration (ms): garbage |",
        "steps: x loss: y",
        "x" * 70000 + " iteration 1/2 | elapsed time per iteration (ms): 1 |",
    ],
)
def test_other_lines_are_not_progress_or_say_nothing_false(line: str) -> None:
    got = parse(line)
    if got is not None:  # a Megatron line with garbage values: the iteration, nothing else
        assert (got.iteration, got.loss, got.iteration_seconds) == (1, None, None)


def test_every_format_is_in_one_table_with_a_marker() -> None:
    assert [f.name for f in formats.FORMATS] == [
        "megatron",
        "torchtitan",
        "deepspeed",
        "hf_trainer",
    ]
    assert all(f.markers for f in formats.FORMATS)


# -- what shippers send ------------------------------------------------------------------
FLUENT_BIT = [
    {
        "date": 1754032777.25,
        "log": "line one\n",
        "stream": "stdout",
        "kubernetes": {
            "pod_name": "bert-worker-0",
            "namespace_name": "ml",
            "pod_id": "uid-0",
            "container_name": "pytorch",
            "host": "gpu-1",
        },
    }
]
VECTOR = [
    {
        "message": "line two",
        "timestamp": "2025-08-01T07:19:37.123456789Z",
        "kubernetes": {
            "pod_name": "bert-worker-1",
            "pod_namespace": "ml",
            "pod_uid": "uid-1",
            "container_name": "pytorch",
        },
    }
]


def test_fluent_bit_json_array_and_json_lines() -> None:
    got = parse_body(json.dumps(FLUENT_BIT).encode(), {})
    assert got.shipper == "fluent-bit" and got.malformed == 0
    assert got.lines == [
        LogLine(
            datetime.fromtimestamp(1754032777.25, UTC),
            "ml",
            "bert-worker-0",
            "pytorch",
            "uid-0",
            "line one",
        )
    ]
    iso = [{**FLUENT_BIT[0], "date": "2025-08-01T07:19:37.250Z"}]
    assert parse_body(json.dumps(iso).encode(), {}).lines == got.lines
    ndjson = "\n".join(json.dumps(r) for r in FLUENT_BIT * 3).encode()
    assert parse_body(ndjson, {}).lines == got.lines * 3


def test_vector_events() -> None:
    got = parse_body(json.dumps(VECTOR).encode(), {})
    assert got.shipper == "vector"
    assert got.lines == [
        LogLine(
            datetime(2025, 8, 1, 7, 19, 37, 123456, UTC),
            "ml",
            "bert-worker-1",
            "pytorch",
            "uid-1",
            "line two",
        )
    ]


def test_plain_lines_name_their_pod_in_the_query() -> None:
    got = parse_body(b"a\nb\n\nc\n", {"namespace": "ml", "pod": "p", "container": "main"})
    assert [(x.text, x.pod, x.at) for x in got.lines] == [
        ("a", "p", None),
        ("b", "p", None),
        ("c", "p", None),
    ]
    with pytest.raises(BodyError) as err:
        parse_body(b"a\n", {"pod": "p"})
    assert err.value.status == 400 and "namespace" in str(err.value)


def test_a_malformed_record_is_counted_and_skipped_the_rest_kept() -> None:
    bad = [
        7,
        {"log": "no pod"},
        {"kubernetes": {"pod_name": "x", "namespace_name": "ml"}},
        {**FLUENT_BIT[0], "date": "yesterday"},
        {**FLUENT_BIT[0], "date": True},
    ]
    got = parse_body(json.dumps(bad + FLUENT_BIT).encode(), {})
    assert got.malformed == 5 and len(got.lines) == 1
    assert got.why == "a record is a JSON object, not int"
    lines_ = b'{"oops\n' + json.dumps(FLUENT_BIT[0]).encode()
    got = parse_body(lines_, {})
    assert (got.malformed, len(got.lines)) == (1, 1)
    for body, why in ((b"[1, 2", "not a JSON array"), (b"plain", "plain lines need")):
        with pytest.raises(BodyError) as err:
            parse_body(body, {})
        assert err.value.status == 400 and why in str(err.value)


def test_gzip_bodies_bounded_once_unpacked() -> None:
    raw = json.dumps(FLUENT_BIT).encode()
    assert gunzip(gzip.compress(raw), "gzip", 1 << 20) == raw
    assert gunzip(gzip.compress(raw), "", 1 << 20) == raw  # gzip's magic, no header
    assert gunzip(raw, "", 1 << 20) == raw
    bomb = gzip.compress(b"0" * (10 << 20))  # 10 KB that unpacks to 10 MB
    assert len(bomb) < 20_000
    cut = gzip.compress(raw)[:-10]
    for body, enc, status in (
        (bomb, "gzip", 413),
        (b"\x1f\x8b\x08garbage", "gzip", 400),
        (cut, "gzip", 400),
        (raw, "br", 415),
    ):
        with pytest.raises(BodyError) as err:
            gunzip(body, enc, 1 << 20)
        assert err.value.status == status


# -- the regression rule -------------------------------------------------------------------
def test_a_regression_is_factor_times_its_own_baseline_for_minutes() -> None:
    # one point a minute: an hour at 1.0, then 3.0 for three minutes, back, 3.0 for one
    pts = [(60.0 * m, 1.0) for m in range(60)] + [
        (3600.0, 3.0),
        (3660.0, 3.0),
        (3720.0, 3.5),
        (3780.0, 1.0),
        (3840.0, 3.0),
        (3900.0, 1.0),
    ]
    got = regressions(pts, 2.0, 2.0, 3600.0, 60.0, since=3000.0)
    assert got == [Regression(3600.0, 3720.0, 3.0, 3.5, 1.0)]
    assert regressions(pts, 2.0, 4.0, 3600.0, 60.0, since=3000.0) == []  # not 4 minutes
    assert regressions(pts, 4.0, 2.0, 3600.0, 60.0, since=3000.0) == []  # not 4x
    assert regressions(pts, 2.0, 2.0, 3600.0, 60.0, since=3800.0) == []  # before since
    nan = [(t, float("nan") if t == 3660.0 else v) for t, v in pts]  # no traffic: skipped
    assert regressions(nan, 2.0, 2.0, 3600.0, 60.0, 3000.0) == [
        Regression(3600.0, 3720.0, 3.0, 3.5, 1.0)
    ]
    zero = [(60.0 * m, 0.0) for m in range(30)] + [(1800.0, 0.5), (1860.0, 0.7)]
    assert regressions(zero, 2.0, 2.0, 3600.0, 60.0, 0.0) == [
        Regression(1800.0, 1860.0, 0.5, 0.7, 0.0)
    ]


def test_the_outlier_rule() -> None:
    rtt = {"a": 0.0005, "b": 0.00052, "c": 0.00049, "d": 0.006}
    # median 0.00051, MAD 0.000015: 0.6745 x 0.00549 / 0.000015
    assert robust_outliers(rtt, "high") == {"d": Flag(0.006, 0.00051, 246.867)}
    assert robust_outliers(rtt, "low") == {}
    same = {"a": 90.0, "b": 90.0, "c": 90.0, "d": 40.0}  # MAD 0: the odd one out
    assert robust_outliers(same, "both") == {"d": Flag(40.0, 90.0, None)}
    near = {"a": 90.0, "b": 90.0, "c": 90.0, "d": 88.0}  # within 10% of the median
    assert robust_outliers(near, "both") == {}
    assert robust_outliers({"a": 1.0, "b": 9.0}, "both") == {}  # fewer than 3 pods
