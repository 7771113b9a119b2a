"""The docs hold: a short README, a metric reference that is the code's (fresh, naming every
family a golden exposition holds and every family the code names, with its labels), and the
recorder's route list, fresh."""

import ast
import re
from pathlib import Path

from scripts import metrics_reference, routes_reference
from tests.golden import GOLDEN

ROOT = Path(__file__).resolve().parents[2]
README_LINES = 80  # a map to the docs site, not a copy of it


def documented() -> set[str]:
    """The families the committed metric reference lists, as the exposition names them."""
    page = (ROOT / "docs" / "reference" / "metrics.md").read_text()
    return set(re.findall(r"^\| `([^`]+)` \|", page, re.M))


def rows() -> dict[str, tuple[set[str], str]]:
    """The committed metric reference's rows: name -> (labels, written by)."""
    page = (ROOT / "docs" / "reference" / "metrics.md").read_text()
    out = {}
    for name, labels, writer in re.findall(
        r"^\| `([^`]+)` \| [^|]* \| [^|]* \| ([^|]*) \| ([^|]*) \|", page, re.M
    ):
        out[name] = (set(re.findall(r"`([^`]+)`", labels)), writer.strip())
    return out


def named_in_code() -> dict[str, str]:
    """Every family name the package writes as a literal, -> where: the first argument of
    Metric(...), a *MetricFamily(...) or a helper that builds one from its arguments (a
    function of the module, or imported from the package, that calls either with a name it
    was given), and the first item of each row of a module's table of tuples that a loop
    building families goes over."""
    trees = {p: ast.parse(p.read_text()) for p in sorted((ROOT / "lens_ebpf").rglob("*.py"))}

    def builds(node: ast.AST) -> bool:
        return isinstance(node, ast.Call) and (
            isinstance(node.func, ast.Name)
            and node.func.id in ("Metric", "Family")
            or metrics_reference.call_name(node).endswith("MetricFamily")
        )

    def module_of(path: Path) -> str:
        return ".".join(path.relative_to(ROOT).with_suffix("").parts)

    def known(tree: ast.AST, module: str) -> set[str]:
        """The helpers a module may call: its own and those it imports."""
        return helpers[module] | {
            a.asname or a.name
            for imp in ast.walk(tree)
            if isinstance(imp, ast.ImportFrom)
            for a in imp.names
            if a.name in helpers.get(imp.module or "", ())
        }

    # module (dotted) -> its helpers: functions that build a family from a name they were
    # given, themselves or through another helper (core.exposition's counter(), ...)
    helpers: dict[str, set[str]] = {module_of(p): set() for p in trees}
    for _ in range(3):
        for path, tree in trees.items():
            module = module_of(path)
            mine = known(tree, module)
            helpers[module] |= {
                fn.name
                for fn in ast.walk(tree)
                if isinstance(fn, ast.FunctionDef)
                and any(
                    isinstance(c, ast.Call)
                    and (builds(c) or metrics_reference.call_name(c) in mine)
                    and c.args
                    and not isinstance(c.args[0], ast.Constant)
                    for c in ast.walk(fn)
                )
            }
    out = {}
    for path, tree in trees.items():
        where = path.relative_to(ROOT).as_posix()
        mine = known(tree, module_of(path))

        def building(node: ast.AST, mine: set[str] = mine) -> bool:
            return (
                builds(node)
                or isinstance(node, ast.Call)
                and bool(node.args)
                and metrics_reference.call_name(node) in mine
            )

        looped = {
            n.iter.id
            for n in ast.walk(tree)
            if isinstance(n, ast.For)
            and isinstance(n.iter, ast.Name)
            and any(map(building, ast.walk(n)))
        }
        for node in ast.walk(tree):
            if building(node):
                first = node.args[0]  # type: ignore[attr-defined]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    out[first.value] = f"{where}:{node.lineno}"  # type: ignore[attr-defined]
        for node in tree.body:
            value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
            target = (
                node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
            )
            if (
                isinstance(value, ast.List | ast.Tuple)
                and isinstance(target, ast.Name)
                and target.id in looped
            ):
                for row in value.elts:
                    if isinstance(row, ast.Tuple) and isinstance(row.elts[0], ast.Constant):
                        out[str(row.elts[0].value)] = f"{where}:{row.lineno} ({target.id})"
    return out


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
    for name in (
        "lens_recorder_db_up",
        "lens_recorder_job_runs_total",
        "lens_training_loss",
        "lens_agent_feature_up",
        "lens_tcp_rtt_seconds",
        "lens_k8s_watch_connected",
        "lens_container_process_exits_total",
        "lens_gpu_faults_total",
    ):
        assert name in have, name


def test_every_family_the_code_names_is_in_the_reference() -> None:
    """Literal names given to a family, to a helper that builds one (rdma's _family, the
    GPU collectors' add, exposition.counter) or in a table a loop builds families from
    (compat_amd.GAUGES, compat_dcgm.FIELDS): each is on the page, whether or not a
    fixture makes it."""
    have = documented()
    have |= {n.removesuffix("_total") for n in have}
    named = named_in_code()
    for name in (
        "lens_rdma_port_counter_total",
        "lens_rdma_port_legacy_counter_total",
        "gpu_package_power",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "lens_pod_volume_used_bytes",
        "lens_recorder_log_lines",
    ):
        assert name in named, f"the test no longer sees {name}"
    missing = {
        n: at for n, at in named.items() if n not in have and n.removesuffix("_total") not in have
    }
    assert not missing, f"not in docs/reference/metrics.md: {missing}"


def test_the_reference_has_the_labels_the_code_builds_at_run_time() -> None:
    """Labels from dicts built at run time: a loop's lbl, a parameter's **node, a helper's
    label argument, a function that returns the labels, a dict's update()."""
    have = rows()
    expect = {
        "lens_training_loss": {"namespace", "workload"},
        "lens_training_slowdowns_total": {"namespace", "workload"},
        "lens_training_stalled": {"namespace", "workload"},
        "lens_pod_volume_used_bytes": {
            "namespace",
            "pod",
            "persistentvolumeclaim",
            "volume",
            "node",
        },
        "node_ephemeral_storage_usage_bytes": {"node"},
        "lens_rdma_port_counter_total": {"device", "port", "counter"},
        "lens_rdma_port_legacy_counter_total": {"device", "port", "counter"},
        "lens_gpu_faults_total": {"gpu", "kind", "code", "namespace", "pod", "workload"},
        "lens_gpu_metrics_table_skipped_total": {"revision"},
        "lens_recorder_log_lines_total": {"result"},
        "lens_recorder_remote_write_refused_total": {"reason"},
        "lens_recorder_cluster_finalizers_released_total": {"cluster"},
        "gpu_package_power": {"gpu_id", "gpu_uuid", "hostname", "pod", "namespace", "container"},
        "DCGM_FI_PROF_PCIE_TX_BYTES": {"gpu", "UUID", "Hostname", "namespace", "pod", "container"},
    }
    for name, labels in expect.items():
        assert labels <= have[name][0], (name, have[name][0])
    for name in (
        "lens_training_loss",
        "lens_pod_volume_used_bytes",
        "lens_rdma_port_counter_total",
        "lens_gpu_faults_total",
    ):
        assert have[name][0] == expect[name], name  # and no others
    for name in ("cpu_load_1m", "lens_recorder_queue_depth", "lens_agent_http_connections"):
        assert have[name][0] == set(), name  # one series, no labels


def test_the_reference_names_who_writes_each_family() -> None:
    have = rows()
    assert have["gpu_package_power"][1] == "gpu, compat amd"
    assert have["DCGM_FI_PROF_PCIE_RX_BYTES"][1] == "gpu, compat dcgm"
    assert have["lens_rdma_port_counter_total"][1] == "rdma"
    # HttpServer serves both services; only the agent registers its collector
    for name in ("lens_agent_http_connections", "lens_agent_metrics_scrapes_total"):
        assert have[name][1] == "agent (HTTP server)", name
    agent = (ROOT / "lens_ebpf" / "agent" / "service.py").read_text()
    assert "self.http.collector()" in agent
    for path in (ROOT / "lens_ebpf" / "recorder").rglob("*.py"):
        assert ".http.collector()" not in path.read_text(), path


def test_the_route_reference_is_fresh() -> None:
    assert (
        routes_reference.PAGE.read_text() == routes_reference.render()
    ), "docs/reference/routes.md is stale: run python scripts/routes_reference.py"
