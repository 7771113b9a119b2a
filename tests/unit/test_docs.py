"""The docs hold: a short README, a metric reference that is the code's (fresh, and naming
every family a golden exposition holds), and the recorder's route list, fresh."""

import re
from pathlib import Path

from scripts import metrics_reference, routes_reference
from tests.golden import GOLDEN

ROOT = Path(__file__).resolve().parents[2]
README_LINES = 250


def documented() -> set[str]:
    """The families the committed metric reference lists, as the exposition names them."""
    page = (ROOT / "docs" / "reference" / "metrics.md").read_text()
    return set(re.findall(r"^\| `([^`]+)` \|", page, re.M))


def test_the_readme_stays_short_and_keeps_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < README_LINES
    assert "make run     # start the agent on this node with the default policy" in text
    assert "make test    # the whole suite" in text


def test_the_metric_reference_is_fresh() -> None:
    page = metrics_reference.PAGE.read_text()
    assert page == metrics_reference.render(
        metrics_reference.collect()
    ), "docs/reference/metrics.md is stale: run python scripts/metrics_reference.py"


def test_every_golden_family_is_in_the_reference() -> None:
    have = documented()
    for path in sorted(GOLDEN.glob("*.prom")):
        for fam in metrics_reference.parse_exposition(path.read_text()).values():
            name = metrics_reference.exported(fam)
            assert name in have, f"{name} ({path.name}) is not in docs/reference/metrics.md"


def test_the_reference_reads_the_code_not_only_the_golden_files() -> None:
    """Families no golden file holds are found in the code: the recorder's, the agent's own."""
    have = documented()
    for name in ("lens_recorder_db_up", "lens_recorder_job_runs_total", "lens_training_loss",
                 "lens_agent_feature_up", "lens_tcp_rtt_seconds", "lens_k8s_watch_connected",
                 "lens_container_process_exits_total", "lens_gpu_faults_total"):  # fmt: skip
        assert name in have, name


def test_the_route_reference_is_fresh() -> None:
    assert (
        routes_reference.PAGE.read_text() == routes_reference.render()
    ), "docs/reference/routes.md is stale: run python scripts/routes_reference.py"
