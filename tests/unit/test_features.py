"""Features plug in by name: a feature declared in one module gets its config section,
its --no-collector flag, its routes, metrics, /readyz state and read cycle, with no other
file touched. The toy feature here is such a module."""

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector
from pydantic import Field

from lens_ebpf.agent import cli, config, feature
from lens_ebpf.agent.feature import RUNNING, Feature, Settings, register
from lens_ebpf.agent.registry import FEATURES
from lens_ebpf.agent.service import Agent
from lens_ebpf.core import settings
from lens_ebpf.core.http import envelope
from lens_ebpf.core.settings import ConfigError
from tests.conftest import hang_guard

ROOT = Path(__file__).resolve().parents[2]


def declared() -> int:
    """How many features the modules of the registry's packages declare (their source)."""
    return sum(
        len(re.findall(r"^@register\(", path.read_text(), re.M))
        for pkg in FEATURES.packages
        for path in (ROOT / pkg.replace(".", "/")).rglob("*.py")
    )


def test_every_declared_feature_is_found_with_its_sections() -> None:
    found = feature.registered()
    assert len({f.name for f in found}) == len(found) == declared()
    assert all(issubclass(f.cls, Feature) for f in found)
    assert [f.order for f in found] == sorted(f.order for f in found)  # start order
    keys = [k for f in found for k in f.settings]
    assert len(keys) == len(set(keys)), keys  # each section has one owner
    docs = "".join(p.read_text() for p in sorted((ROOT / "docs").rglob("*.md")))
    for key, model in feature.collector_settings().items():
        assert issubclass(model, Settings)  # so `enabled` and --no-collector.<key>
        assert f"collectors.{key}" in docs, f"docs/ says nothing of collectors.{key}"
    assert set(cli.collectors()) == set(keys)


def test_shipped_defaults_match_the_models() -> None:
    """defaults.yaml documents every default; the models hold them: the two agree."""
    shipped = yaml.safe_load(config.shipped())
    models = settings.defaults(config.Config, [], FEATURES.settings())

    def walk(doc: dict, model: dict, where: str) -> None:
        for key, value in doc.items():
            assert key in model, f"defaults.yaml: {where}{key} is no setting"
            if isinstance(value, dict) and isinstance(model[key], dict) and value:
                walk(value, model[key], f"{where}{key}.")
            else:
                assert value == model[key], f"defaults.yaml: {where}{key}"

    walk(shipped, models, "")


class ToySettings(Settings):
    interval_seconds: float = Field(1.0, gt=0)
    greeting: str = "hello"


class ToyCollector(Collector):
    def __init__(self, toy: "ToyFeature") -> None:
        self.toy = toy

    def describe(self):
        return iter(())

    def collect(self):
        yield CounterMetricFamily("lens_toy_reads", "Read cycles seen", value=self.toy.reads)


class ToyFeature(Feature):
    """What a new feature's module holds: settings, start, collectors, routes, read, stop."""

    reads = 0
    stopped = False

    def enabled(self) -> str:
        return "" if self.ctx.settings("toy", ToySettings).enabled else "disabled by config"

    def start(self) -> None:
        self.state = {"state": RUNNING, "reason": ""}

    def collectors(self) -> list[Collector]:
        return [ToyCollector(self)]

    def routes(self):
        return {"/toy": lambda: envelope(self.ctx.settings("toy", ToySettings).greeting)}

    def read(self) -> None:
        self.reads += 1

    def stop(self) -> None:
        ToyFeature.stopped = True


@pytest.fixture
def toy() -> Iterator[type[ToyFeature]]:
    feature.registered()
    register("toy", order=40, settings={"toy": ToySettings})(ToyFeature)
    yield ToyFeature
    del FEATURES.parts["toy"]


def test_a_new_feature_brings_its_config_and_flag(toy) -> None:
    cfg = config.load(None, env={"LENS_COLLECTORS__TOY__GREETING": "hi"})
    assert cfg.collectors.section("toy") == ToySettings(greeting="hi")
    with pytest.raises(ConfigError, match="collectors.toy.interval_seconds: Input should"):
        config.load(None, env={"LENS_COLLECTORS__TOY__INTERVAL_SECONDS": "0"})
    assert "toy" in cli.collectors()
    args = cli.build_parser().parse_args(["run", "--no-collector.toy"])
    assert cli._overrides(args)[("collectors", "toy", "enabled")] is False


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=hang_guard(5)) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.usefixtures("tracefs_readable")
def test_the_agent_runs_a_new_feature_end_to_end(toy) -> None:
    off = {
        (f"collectors.{k}.enabled"): False
        for k in ("tcp", "rtt", "processes", "gpu", "rdma", "system", "drops")
    }
    overrides = {tuple(k.split(".")): v for k, v in off.items()}
    overrides |= {
        ("server", "host"): "127.0.0.1",
        ("server", "port"): 0,
        ("grpc", "listen"): "127.0.0.1:0",
        ("kubernetes", "mode"): "off",
        ("kubernetes", "pod_resources", "enabled"): False,
        ("bpf", "read_interval_seconds"): 0.05,
    }
    agent = Agent(config.load(None, env={}, overrides=overrides))
    agent.start()
    try:
        assert agent.http is not None
        port = agent.http.port
        assert get(port, "/toy") == (
            200,
            json.dumps({"code": 0, "data": "hello", "message": "success"}, sort_keys=True) + "\n",
        )
        ready = json.loads(get(port, "/readyz")[1])
        assert ready["features"]["toy"] == {"state": "running", "reason": ""}
        assert ready["features"]["gpu"] == {"state": "off", "reason": "disabled by config"}
        # the routes of features that are off still answer, with empty data
        assert json.loads(get(port, "/gpus")[1])["data"] == []
        metrics = get(port, "/metrics")[1]
        assert 'lens_agent_feature_up{feature="toy",path=""} 1.0' in metrics
        assert "lens_toy_reads_total" in metrics
    finally:
        agent.stop()
    toy_feature = next(f for f in agent.features if f.name == "toy")
    assert ToyFeature.stopped and toy_feature.reads >= 1  # type: ignore[attr-defined]


class BrokenFeature(Feature):
    def start(self) -> None:
        raise RuntimeError("cannot load: the compile failed")


@pytest.mark.usefixtures("tracefs_readable")
def test_a_feature_that_fails_to_start_makes_the_agent_not_ready() -> None:
    feature.registered()
    register("broken", order=40)(BrokenFeature)
    overrides = {
        ("server", "host"): "127.0.0.1",
        ("server", "port"): 0,
        ("grpc", "listen"): "127.0.0.1:0",
        ("kubernetes", "mode"): "off",
        ("collectors", "tcp", "enabled"): False,
        ("collectors", "processes", "enabled"): False,
        ("collectors", "drops", "enabled"): False,
    }
    agent = Agent(config.load(None, env={}, overrides=overrides))
    try:
        agent.start()  # the others start; the agent serves
        assert agent.http is not None
        status, body = get(agent.http.port, "/readyz")
        ready = json.loads(body)
        assert status == 503 and ready["ready"] is False
        assert ready["failed"] == {"broken": "cannot load: the compile failed"}
        assert ready["features"]["system"]["state"] == "running"
    finally:
        agent.stop()
        del FEATURES.parts["broken"]
