"""The map in docs/design.md's Layers section, kept true: every import of lens_ebpf
(module level, inside functions, under TYPE_CHECKING) goes down the layers, never from
one service into the other; no package imports back into one that imports it; each
service runs without the other's libraries; and no hand-written module is over 600 lines
nor function over 120."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
import tomllib
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from lens_ebpf.core.routes import Request, RouteTable

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "lens_ebpf"
# layer -> the layers it may import (itself included); the root package holds the version
ALLOWED = {
    "core": {"core"},
    "protocol": {"core", "protocol"},
    "k8s": {"core", "k8s"},
    "agent": {"core", "protocol", "k8s", "agent"},
    "recorder": {"core", "protocol", "k8s", "recorder"},
    "cli": {"core", "protocol", "k8s", "agent", "recorder", "cli"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PKG.rglob("*.py") if "gen" not in p.parts}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every lens_ebpf module this one imports, wherever the import statement stands."""
    out = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "lens_ebpf"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([node.module] if node.module else [])])
            if base.split(".")[0] != "lens_ebpf":
                continue
            for a in node.names:  # `from pkg import module` names a module
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    return out


def layer(name: str) -> str:
    parts = name.split(".")
    if len(parts) == 1 or parts[1] in ("cli", "__main__"):
        return "cli" if len(parts) > 1 else "root"
    return parts[1]


def unit(name: str) -> str:
    """The node the cycle check sees: a service's subpackage or module, a shared package."""
    parts = name.split(".")
    return ".".join(
        parts[:3] if len(parts) > 2 and parts[1] in ("agent", "recorder") else parts[:2]
    )


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def test_imports_go_down_the_layers_and_never_across_services() -> None:
    wrong = []
    for name, targets in graph().items():
        src = layer(name)
        for target in targets:
            dst = layer(target)
            if dst != "root" and src != "root" and dst not in ALLOWED[src]:
                wrong.append(f"{name} imports {target} ({src} -> {dst})")
    assert wrong == []


def test_no_package_imports_back_into_one_that_imports_it() -> None:
    edges: dict[str, set[str]] = defaultdict(set)
    for name, targets in graph().items():
        for target in targets:
            if unit(name) != unit(target) and layer(target) != "root":
                edges[unit(name)].add(unit(target))
    cycles = []
    state: dict[str, int] = {}  # 1 on the path, 2 done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*path[path.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert cycles == []


HTTP_LAYER = ("lens_ebpf.recorder.api", "lens_ebpf.core.http", "lens_ebpf.core.routes", "aiohttp")
# the recorder's HTTP layer: its API package, and the module that wires the service
HTTP_MODULES = ("lens_ebpf.recorder.api", "lens_ebpf.recorder.service")


def under(name: str, roots: tuple[str, ...]) -> bool:
    return any(name == r or name.startswith(r + ".") for r in roots)


def breaches(
    check: Callable[[str, ast.AST], list[str]], roots: tuple[str, ...] = ("lens_ebpf",)
) -> list[str]:
    """What check finds in each module under roots, in the modules' order."""
    return [
        b
        for name, path in sorted(modules().items())
        if under(name, roots)
        for b in check(name, ast.parse(path.read_text()))
    ]


def http_imports(name: str, path: Path, known: set[str]) -> set[str]:
    """What of the HTTP layer a module imports (aiohttp too), wherever it stands."""
    found = {t for t in imports(name, path, known) if under(t, HTTP_LAYER)}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "aiohttp"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "aiohttp":
            found.add(node.module or "")
    return found


def test_the_recorders_domain_never_imports_the_http_layer() -> None:
    mods = modules()
    wrong = [
        f"{name} imports {sorted(got)}"
        for name, path in sorted(mods.items())
        if under(name, ("lens_ebpf.recorder",))
        and not under(name, HTTP_MODULES)
        and (got := http_imports(name, path, set(mods)))
    ]
    assert wrong == []


def test_the_recorder_keeps_its_modules_in_its_domains() -> None:
    """At most 12 modules directly in lens_ebpf/recorder/ (issue 68): the rest live in the
    package of their domain (nodes/, workloads/, alerts/, tracker/, ...)."""
    flat = sorted(p.name for p in (PKG / "recorder").glob("*.py"))
    assert len(flat) <= 12, flat


def test_the_http_check_sees_a_domain_module_that_imports_it(tmp_path: Path) -> None:
    src = tmp_path / "x.py"
    src.write_text(
        "from lens_ebpf.recorder.api.envelope import ok\n" "def f():\n    from aiohttp import web\n"
    )
    assert http_imports("lens_ebpf.recorder.x", src, set(modules())) == {
        "lens_ebpf.recorder.api.envelope",
        "aiohttp",
    }


# where route tables may be made: the recorder's resource modules, the agent's REST
TABLE_MAKERS = ("lens_ebpf.recorder.api.", "lens_ebpf.agent.service")
ROUTE_MACHINERY = ("lens_ebpf.core.http", "lens_ebpf.core.routes")


def route_breaches(name: str, tree: ast.AST) -> list[str]:
    """Routes added another way than a RouteTable mounted: the server's private
    registration called outside the machinery, a table made outside its designated
    modules, a table mounted outside the one list (recorder.api) or the agent's REST."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        called = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        on = f.value if isinstance(f, ast.Attribute) else None  # what it is called on
        server = getattr(on, "attr", getattr(on, "id", "")) in ("http", "_routes")
        if (
            server
            and called in ("add", "add_query", "add_post", "mount")
            and name not in ROUTE_MACHINERY
            and (called != "mount" or name not in ("lens_ebpf.recorder.api", TABLE_MAKERS[1]))
        ):
            out.append(f"{name}: {called}() on the server")
        if called == "RouteTable" and not (
            name.startswith(TABLE_MAKERS[0]) and name.count(".") == 3 or name == TABLE_MAKERS[1]
        ):
            out.append(f"{name}: makes a RouteTable")
    return out


def listed_tables(api: Path = PKG / "recorder" / "api") -> tuple[set[str], set[str]]:
    """The recorder.api modules that make a table, and those recorder/api/__init__.py's
    ROUTES list."""
    made = {
        p.stem
        for p in api.glob("*.py")
        if any(
            isinstance(n, ast.Call) and getattr(n.func, "id", "") == "RouteTable"
            for n in ast.walk(ast.parse(p.read_text()))
        )
    }
    listed: set[str] = set()
    for node in ast.walk(ast.parse((api / "__init__.py").read_text())):
        if isinstance(node, ast.AnnAssign | ast.Assign):
            target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
            if getattr(target, "id", "") == "ROUTES" and node.value is not None:
                listed |= {
                    n.value.id
                    for n in ast.walk(node.value)
                    if isinstance(n, ast.Attribute)
                    and n.attr == "routes"
                    and isinstance(n.value, ast.Name)
                }
    return made, listed


def test_routes_are_added_one_way_and_listed_in_one_place() -> None:
    wrong = breaches(route_breaches)
    assert wrong == []
    made, listed = listed_tables()
    assert made and made == listed


def test_the_route_check_sees_a_route_added_another_way() -> None:
    src = (
        "from lens_ebpf.core.routes import RouteTable\n"
        "def wire(self):\n    self.http.add_query('/x', f)\n    t = RouteTable()\n"
        "    self.http.mount('', s, t)\n"
    )
    assert route_breaches("lens_ebpf.recorder.jobs.x", ast.parse(src)) == [
        "lens_ebpf.recorder.jobs.x: add_query() on the server",
        "lens_ebpf.recorder.jobs.x: makes a RouteTable",
        "lens_ebpf.recorder.jobs.x: mount() on the server",
    ]
    # a resource module makes its table, and leaves mounting it to the list
    assert route_breaches("lens_ebpf.recorder.api.nodes", ast.parse(src)) == [
        "lens_ebpf.recorder.api.nodes: add_query() on the server",
        "lens_ebpf.recorder.api.nodes: mount() on the server",
    ]


def test_the_list_check_sees_a_table_left_out(tmp_path: Path) -> None:
    (tmp_path / "nodes.py").write_text("routes = RouteTable()\n")
    (tmp_path / "gpus.py").write_text("routes = RouteTable()\n")
    (tmp_path / "__init__.py").write_text("ROUTES = [(nodes.routes, PREFIXES, 'lens')]\n")
    assert listed_tables(tmp_path) == ({"nodes", "gpus"}, {"nodes"})


# -- one handler contract: every recorder handler takes the request context -----------------
def handler_breaches(tables: list[RouteTable]) -> list[str]:
    """The routes whose handler is not `def handler(ask: Ask)` (envelope.Ask: the request,
    the service's parts, the database, the surface calling it), whatever its surface."""
    out = []
    for table in tables:
        for r in table.routes:
            got = [
                (p.name, p.annotation if isinstance(p.annotation, str) else p.annotation.__name__)
                for p in inspect.signature(r.handler).parameters.values()
            ]
            if got != [("ask", "Ask")]:
                out.append(f"{r.method} {r.path}: {r.handler.__name__}{got}")
    return out


def test_every_recorder_handler_takes_the_request_context() -> None:
    from lens_ebpf.recorder.api import ROUTES

    tables = [t for t, _, _ in ROUTES]
    assert len(tables) > 20 and handler_breaches(tables) == []


def test_the_handler_check_sees_a_handler_written_another_way() -> None:
    from lens_ebpf.recorder.api.envelope import Ask

    routes = RouteTable()

    @routes.get("a")
    def a(ask: Ask) -> None: ...

    @routes.post("b")
    def b(req: Request, app: object) -> None: ...

    @routes.get("c")
    def c() -> None: ...

    assert handler_breaches([routes]) == [
        "POST b: b[('req', 'Request'), ('app', 'object')]",
        "GET c: c[]",
    ]


# -- one status -> meta.code table, one exception mapping, for every recorder surface --------
CODE_TABLE = ("lens_ebpf.recorder.api.envelope", "CODES")
# what a handler may raise that a surface answers (envelope.failure() reads them)
ANSWERED = {
    *("ApiError", "BadRequest", "NotFound", "Conflict", "Forbidden", "Unavailable"),
    *("QueryError", "PromError", "TooManyPoints", "SQLAlchemyError", "IntegrityError"),
    *("DataError", "OperationalError", "StatementError"),
}


def answer_breaches(name: str, tree: ast.AST) -> list[str]:
    """A second status -> meta.code table (a dict of HTTP statuses to the API's 4-digit
    codes) anywhere but envelope.CODES; a surface's except clause that answers a
    handler's error itself instead of through failure()."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Dict):
            target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
            pairs = [
                (k.value, v.value)
                for k, v in zip(node.value.keys, node.value.values, strict=True)
                if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)
            ]
            codes = [
                (k, v)
                for k, v in pairs
                if isinstance(k, int) and isinstance(v, int) and 100 <= k < 600 and 1000 <= v < 6000
            ]
            if len(codes) >= 2 and (name, getattr(target, "id", "")) != CODE_TABLE:
                out.append(f"{name}: {getattr(target, 'id', '?')} maps statuses to codes")
        if not (isinstance(node, ast.ExceptHandler) and name.startswith("lens_ebpf.recorder.api")):
            continue
        caught = {
            n.id if isinstance(n, ast.Name) else n.attr
            for n in ast.walk(node.type or ast.Constant(None))
            if isinstance(n, ast.Name | ast.Attribute)
        }
        calls = {getattr(n.func, "id", "") for n in ast.walk(node) if isinstance(n, ast.Call)}
        answers = any(
            isinstance(n, ast.Return) and n.value is not None and not _none(n.value)
            for n in ast.walk(node)
        )
        if caught & ANSWERED and answers and "failure" not in calls:
            out.append(f"{name}: answers {sorted(caught & ANSWERED)} itself")
    return out


def _none(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def test_one_code_table_and_one_exception_mapping() -> None:
    wrong = breaches(answer_breaches, ("lens_ebpf.recorder",))
    assert wrong == []


def test_the_answer_check_sees_a_second_table_and_an_own_mapping() -> None:
    src = (
        "CODES = {400: 4001, 404: 4004}\nSIZES = {400: 1, 404: 2}\n"
        "def call(route, req):\n    try:\n        return route.handler(req)\n"
        "    except NotFound as exc:\n        return 404, str(exc)\n"
        "    except BadRequest:\n        return None\n"
        "    except Exception as exc:\n        e = failure(exc)\n        return e\n"
    )
    assert answer_breaches("lens_ebpf.recorder.api.x", ast.parse(src)) == [
        "lens_ebpf.recorder.api.x: CODES maps statuses to codes",
        "lens_ebpf.recorder.api.x: answers ['NotFound'] itself",
    ]


# -- leader-only work gated one way: a job made by recorder/jobs' leader_job() --------------
JOB_MAKER = "lens_ebpf/recorder/jobs/__init__.py"  # leader_job(), replica_job()
# where the recorder may ask whether it leads, and why it is not a gate of leader work
LEADS_ASKED = {
    "lens_ebpf/recorder/service/__init__.py": "RecorderApp.leads(), the runner's gate; "
    "readiness saying which replica leads",
    "lens_ebpf/recorder/ingest/leadership.py": "the Lease and the term themselves",
    "lens_ebpf/recorder/api/posts.py": "POST /logs handed to the leader",
    "lens_ebpf/recorder/management/job_history.py": "runs recorded where the leader ran them",
}


def leader_breaches(rel: str, tree: ast.AST) -> list[str]:
    """Leader-only work gated another way than a leader_job() the runner gates: a Job
    made outside recorder/jobs (leader_only said by hand), leads() asked elsewhere."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        called = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        if rel != JOB_MAKER and called == "Job":
            out.append(f"{rel}: Job() made by hand")
        if rel != JOB_MAKER and any(k.arg == "leader_only" for k in node.keywords):
            out.append(f"{rel}: leader_only= said by hand")
        if called == "leads" and rel not in LEADS_ASKED:
            out.append(f"{rel}: asks leads()")
    return out


def test_leader_only_work_is_registered_one_way() -> None:
    wrong = [
        b
        for p in sorted((PKG / "recorder").rglob("*.py"))
        for b in leader_breaches(str(p.relative_to(ROOT)), ast.parse(p.read_text()))
    ]
    assert wrong == []


def test_the_leader_check_sees_work_gated_another_way() -> None:
    src = (
        "def jobs(app):\n    if app.leadership.leads():\n        app.scan()\n"
        "    return [Job('x', 60, f, leader_only=True), leader_job('y', 60, g)]\n"
    )
    assert leader_breaches("lens_ebpf/recorder/x.py", ast.parse(src)) == [
        "lens_ebpf/recorder/x.py: asks leads()",
        "lens_ebpf/recorder/x.py: Job() made by hand",
        "lens_ebpf/recorder/x.py: leader_only= said by hand",
    ]


# -- SQL only in domain modules: the HTTP layer calls them, and speaks no SQL ----------------
SQL_TYPES = {"Connection", "Engine"}  # what the HTTP layer may name of sqlalchemy (types)


def sql_breaches(name: str, tree: ast.AST) -> list[str]:
    """A statement built or run in the recorder's HTTP layer: sqlalchemy imported for more
    than its errors (sqlalchemy.exc) and connection types, or .execute() called."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sqlalchemy":
            if node.module != "sqlalchemy.exc":
                out += [
                    f"{name}: imports {a.name} from {node.module}"
                    for a in node.names
                    if a.name not in SQL_TYPES
                ]
        elif isinstance(node, ast.Import):
            out += [f"{name}: imports {a.name}" for a in node.names if a.name == "sqlalchemy"]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("execute", "exec_driver_sql")
        ):
            out.append(f"{name}: calls {node.func.attr}()")
    return out


def test_sql_lives_in_the_domain_modules() -> None:
    wrong = breaches(sql_breaches, ("lens_ebpf.recorder.api",))
    assert wrong == []


def test_the_sql_check_sees_a_statement_in_a_handler() -> None:
    src = (
        "from sqlalchemy import Connection, select\nfrom sqlalchemy.exc import DataError\n"
        "def f(ask):\n    import sqlalchemy\n    return ask.conn.execute(select(t))\n"
    )
    assert sql_breaches("lens_ebpf.recorder.api.x", ast.parse(src)) == [
        "lens_ebpf.recorder.api.x: imports select from sqlalchemy",
        "lens_ebpf.recorder.api.x: imports sqlalchemy",
        "lens_ebpf.recorder.api.x: calls execute()",
    ]


# -- one idiom for a metric family: core.exposition's counter(), gauge(), histogram(), family()
EXPOSITION = "lens_ebpf.core.exposition"
FAMILY_MAKERS = {"Metric", "Family"}  # and prometheus_client's *MetricFamily classes
SAMPLE_PUTTERS = {"add_sample", "add_metric"}  # Family.add/add_buckets name the samples


def family_breaches(name: str, tree: ast.AST) -> list[str]:
    """A metric family built another way than by core.exposition's functions: a Metric, a
    Family or a prometheus_client *MetricFamily made by hand, a class of its own over one,
    a sample put by its name (add_sample, add_metric)."""
    if name == EXPOSITION:
        return []
    imported = {  # prometheus_client's names and core.exposition's (not a Family of its own)
        a.asname or a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom)
        and ((n.module or "").startswith("prometheus_client") or n.module == EXPOSITION)
        for a in n.names
    }

    def family_class(node: ast.expr) -> str:
        called = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
        known = isinstance(node, ast.Attribute) or called in imported
        maker = called in FAMILY_MAKERS or called.endswith("MetricFamily")
        return called if known and maker else ""

    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            out += [f"{name}: class {node.name}({c})" for c in map(family_class, node.bases) if c]
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        called = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        if family_class(f):
            out.append(f"{name}: {called}() made by hand")
        if isinstance(f, ast.Attribute) and called in SAMPLE_PUTTERS:
            out.append(f"{name}: {called}()")
    return out


def test_metric_families_are_built_one_way() -> None:
    wrong = breaches(family_breaches)
    assert wrong == []


def test_the_family_check_sees_a_family_built_another_way() -> None:
    src = (
        "from prometheus_client.core import CounterMetricFamily, Metric\n"
        "from lens_ebpf.core.exposition import Family, counter\n"
        "class Mine(core.Metric):\n    pass\n"
        "def collect(n):\n    m = Metric('x', 'help', 'gauge')\n"
        "    m.add_sample('x', {}, n)\n"
        "    c = CounterMetricFamily('y', 'help', labels=['a'])\n"
        "    c.add_metric(['b'], n)\n"
        "    return [m, c, Family('w', 'help', 'gauge'), counter('z', 'help', n)]\n"
    )
    assert family_breaches("lens_ebpf.agent.x", ast.parse(src)) == [
        "lens_ebpf.agent.x: class Mine(Metric)",
        "lens_ebpf.agent.x: Metric() made by hand",
        "lens_ebpf.agent.x: add_sample()",
        "lens_ebpf.agent.x: CounterMetricFamily() made by hand",
        "lens_ebpf.agent.x: add_metric()",
        "lens_ebpf.agent.x: Family() made by hand",
    ]
    assert family_breaches(EXPOSITION, ast.parse(src)) == []
    own = "class Family:\n    pass\ndef declare():\n    return Family()\n"  # the cache's
    assert family_breaches("lens_ebpf.agent.metrics.x", ast.parse(own)) == []


def test_the_checker_sees_imports_in_functions_and_type_checking(tmp_path: Path) -> None:
    src = tmp_path / "x.py"
    src.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from lens_ebpf.recorder.store.writer import Writer\n"
        "def f():\n    import lens_ebpf.agent.trace\n"
    )
    known = set(modules())
    assert imports("lens_ebpf.core.x", src, known) == {
        "lens_ebpf.recorder.store.writer",
        "lens_ebpf.agent.trace",
    }


def test_each_extra_brings_its_own_service_only() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(reqs: list[str]) -> set[str]:
        return {
            r.split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower() for r in reqs
        }

    base = names(meta["dependencies"])
    extras = {k: names(v) for k, v in meta["optional-dependencies"].items()}
    database = {"sqlalchemy", "alembic", "psycopg"}
    devices = {"psutil", "nvidia-ml-py", "amdsmi"}
    assert not (base | extras["agent"]) & database  # pip install .[agent]
    assert not (base | extras["recorder"]) & devices  # pip install .[recorder]
    assert database <= extras["recorder"] and devices <= extras["agent"]


BLOCK = """
import importlib, pkgutil, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError(f"{{name}} is not installed in this image")
sys.meta_path.insert(0, Block())
import {package}
for mod in pkgutil.walk_packages({package}.__path__, "{package}."):
    if ".gen" not in mod.name and ".migrations" not in mod.name:  # alembic runs those
        importlib.import_module(mod.name)
print("imported")
"""


def imports_without(package: str, blocked: set[str]) -> subprocess.CompletedProcess[str]:
    code = BLOCK.format(package=package, blocked=sorted(blocked))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)


def test_the_recorder_needs_nothing_of_the_agents() -> None:
    res = imports_without("lens_ebpf.recorder", {"bcc", "psutil", "pynvml", "amdsmi"})
    assert res.stdout.strip() == "imported", res.stderr


def test_the_agent_needs_nothing_of_the_recorder() -> None:
    res = imports_without("lens_ebpf.agent", {"sqlalchemy", "alembic", "psycopg"})
    assert res.stdout.strip() == "imported", res.stderr


# -- periodic work goes through the runner (lens_ebpf/core/runner.py) ------------------
RUNNER = "lens_ebpf/core/runner.py"
# loops that wait with a timeout and are not periodic jobs: (module, function) -> why
NOT_JOBS = {
    (
        "lens_ebpf/agent/stream/grpc_server.py",
        "EventService._stream",
    ): "a subscriber's stream: a short linger gathers a batch of the bus's events",
    (
        "lens_ebpf/agent/stream/reporter.py",
        "Reporter._requests",
    ): "a stream: waits for the collector's first ack, then for events to send",
    ("lens_ebpf/agent/stream/reporter.py", "Reporter._run"): "a reconnect backoff",
    ("lens_ebpf/agent/deepdive/pyspy.py", "PySpy.run"): "a dump waiting, up to "
    "dump_timeout_seconds, for one of the node's max_running py-spy runs to end",
    ("lens_ebpf/agent/otlp/exporter.py", "Sender.deliver"): "a request sent again after a "
    "backoff while the OTLP endpoint fails",
    ("lens_ebpf/k8s/reflector.py", "Reflector.run"): "a watch stream and its reconnect backoff",
    ("lens_ebpf/k8s/election.py", "LeaderElector.run"): "the Lease's campaign and renewals: "
    "client-go's retry period and renew deadline, the gate the runner asks",
    ("lens_ebpf/recorder/ingest/leadership.py", "Leadership._started"): "claiming the term, again "
    "after a second while the database is down",
    ("lens_ebpf/recorder/cli.py", "run"): "the main thread waiting for a signal or the "
    "Lease's loss",
    (
        "lens_ebpf/protocol/collector_server.py",
        "EventReceiver._serve",
    ): "a reporter's stream: acks gathered over a short sleep",
    ("lens_ebpf/recorder/store/writer.py", "Writer.flush"): "waits, to a deadline, for the "
    "write queue to empty",
    ("lens_ebpf/recorder/store/writer.py", "Writer.run"): "the write queue's consumer",
    (
        "lens_ebpf/recorder/tracker/finalizers.py",
        "Finalizers._finalizer_loop",
    ): "the finalizer queue's consumer, with a backoff after a failure",
}


def _timed_wait(call: ast.Call) -> bool:
    """time.sleep(x), asyncio.sleep(x), event.wait(x), cond.wait(timeout=x)."""
    f = call.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    if name == "sleep":
        return True
    return name == "wait" and bool(call.args or any(k.arg == "timeout" for k in call.keywords))


def _own(nodes: list[ast.AST]) -> list[ast.AST]:
    """The nodes and what they hold, not looking into functions or classes defined there."""
    out, stack = [], list(nodes)
    while stack:
        n = stack.pop()
        if not isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            out.append(n)
            stack.extend(ast.iter_child_nodes(n))
    return out


def timed_loops(path: Path) -> set[str]:
    """The functions (Class.method) holding a while loop whose test or body waits with a
    timeout: a thread that wakes up every so often, i.e. a periodic job."""
    found: set[str] = set()

    def visit(node: ast.AST, scope: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                visit(child, f"{scope}.{child.name}".lstrip("."))
                continue
            if isinstance(child, ast.While) and any(
                isinstance(n, ast.Call) and _timed_wait(n) for n in _own([child.test, *child.body])
            ):
                found.add(scope)
            visit(child, scope)

    visit(ast.parse(path.read_text()), "")
    return found


def test_periodic_loops_run_in_the_runner() -> None:
    """A loop that waits with a timeout is a job for core/runner (intervals, jitter, stop,
    the leader gate, its metrics) unless NOT_JOBS says what else it is."""
    found = {
        (str(p.relative_to(ROOT)), f)
        for p in sorted(PKG.rglob("*.py"))
        if str(p.relative_to(ROOT)) != RUNNER
        for f in timed_loops(p)
    }
    assert found - NOT_JOBS.keys() == set(), "periodic loops outside lens_ebpf/core/runner.py"
    assert NOT_JOBS.keys() - found == set(), "NOT_JOBS names loops that are gone"


def test_the_loop_checker_sees_waits_in_tests_and_bodies(tmp_path: Path) -> None:
    src = tmp_path / "x.py"
    src.write_text(
        "import time\n"
        "def refresh(stop):\n    while not stop.wait(5):\n        pass\n"
        "class Poller:\n    def run(self):\n        while True:\n            time.sleep(1)\n"
        "    def consume(self, q):\n        while True:\n            q.get(timeout=1)\n"
        "async def stream(ev):\n    while True:\n        await ev.wait()\n"
        "def outer(stop):\n    while True:\n"
        "        def inner():\n            stop.wait(1)\n"
        "def drain(cond):\n    while cond:\n        cond.wait(timeout=0.5)\n"
    )
    assert timed_loops(src) == {"refresh", "Poller.run", "drain"}


# -- sizes: a module a reader holds in mind, a function that fits on a screen or two -------
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 120  # from its first decorator to its last line


def generated(path: Path) -> bool:
    """protoc's output (scripts/gen_protos.sh): the gen/ folders, *_pb2*.py files."""
    return "gen" in path.relative_to(PKG).parts or "_pb2" in path.name


# what may stay over a limit, and how far (none since issue 68's splits): an entry may
# only shrink, and goes once its module or function is within the limit
OVER: dict[str, int] = {}


def function_sizes(path: Path) -> dict[str, int]:
    """Class.function (nested ones too) -> its lines, decorators included."""
    out: dict[str, int] = {}

    def visit(node: ast.AST, scope: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{scope}.{child.name}".lstrip(".")
                if not isinstance(child, ast.ClassDef):
                    first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                    out[name] = (child.end_lineno or child.lineno) - first + 1
                visit(child, name)
            else:
                visit(child, scope)

    visit(ast.parse(path.read_text()), "")
    return out


def sizes() -> dict[str, int]:
    """Every hand-written module under lens_ebpf/ (path -> lines) and its functions
    (path:Class.function -> lines) over the limits."""
    out: dict[str, int] = {}
    for path in sorted(PKG.rglob("*.py")):
        if generated(path):
            continue
        rel = str(path.relative_to(ROOT))
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES:
            out[rel] = lines
        out |= {f"{rel}:{f}": n for f, n in function_sizes(path).items() if n > MAX_FUNCTION_LINES}
    return out


def test_no_module_over_600_lines_nor_function_over_120() -> None:
    over = sizes()
    assert {k: n for k, n in over.items() if n > OVER.get(k, 0)} == {}, "over the limits"
    assert OVER.keys() - over.keys() == set(), "OVER names what is within the limits now"


def test_the_formatter_owns_the_layout() -> None:
    """No line opts out of ruff format: the layout is the formatter's (make fmt)."""
    marker = "fmt: " + "skip"  # spelled apart, or this file would hold one
    held = [
        f"{p.relative_to(ROOT)}:{n}"
        for top in ("lens_ebpf", "tests", "bench", "scripts")
        for p in sorted((ROOT / top).rglob("*.py"))
        if "/gen/" not in str(p)
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if marker in line or "fmt: " + "off" in line
    ]
    assert held == [], held[:20]


def test_the_size_check_sees_long_functions_and_skips_generated_code(tmp_path: Path) -> None:
    src = tmp_path / "x.py"
    body = "".join(f"    x{i} = {i}\n" for i in range(130))
    src.write_text(
        f"class A:\n    @staticmethod\n    def f():\n{body.replace('    ', '        ')}"
        f"def g():\n    def h():\n{body.replace('    ', '        ')}"
    )
    assert function_sizes(src) == {"A.f": 132, "g": 132, "g.h": 131}
    assert generated(PKG / "protocol" / "gen" / "lens_pb2.py")
    assert generated(PKG / "k8s" / "x_pb2_grpc.py")
    assert not generated(PKG / "recorder" / "tracker" / "pods.py")
