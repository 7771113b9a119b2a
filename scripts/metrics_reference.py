"""Writes docs/reference/metrics.md: every metric family the agent and the recorder export.

Three sources, each the code's own, merged by family name (the first that knows a family
wins, in this order):

1. the golden expositions (tests/golden/*.prom): the device collectors (system, gpu and its
   compat sets, rdma) and the network families run on the repo's fixtures, compared byte
   for byte with the code by their tests; families built from tables (rdma port counters,
   `rdma_stat_<counter>`, AMD's ECC blocks) are only known by running them;
2. the families the TCP feature registers in the agent's metric cache (its programs run in
   the kernel; registering them needs neither root nor BPF);
3. every other family, read from the code that builds it: each `Metric(...)`,
   `*MetricFamily(...)` and `cache.register(...)` whose name is a literal or a `for` over a
   literal table, its labels from the `labels=` it is given and the `add_sample` calls on it.

python scripts/metrics_reference.py writes the page; --check exits 1 when it differs
(tests/unit/test_docs.py runs that check).
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PAGE = ROOT / "docs" / "reference" / "metrics.md"
GOLDEN = ROOT / "tests" / "golden"
PACKAGE = ROOT / "lens_ebpf"
NAME = re.compile(r"^[a-zA-Z][a-zA-Z0-9_]*_[a-zA-Z0-9]+$")
KINDS = {"COUNTER": "counter", "GAUGE": "gauge", "HISTOGRAM": "histogram"}
CLASSES = {"CounterMetricFamily": "counter", "GaugeMetricFamily": "gauge",
           "HistogramMetricFamily": "histogram", "SummaryMetricFamily": "summary",
           "InfoMetricFamily": "info"}  # fmt: skip
# base-unit suffixes (docs/reference/metric-conventions.md), longest first
UNITS = (("_bytes_per_second", "bytes/s"), ("_seconds", "seconds"), ("_bytes", "bytes"),
         ("_joules", "joules"), ("_watts", "watts"), ("_celsius", "°C"), ("_ratio", "ratio"),
         ("_percent", "percent"), ("_mhz", "MHz"), ("_mbs", "Mb/s"))  # fmt: skip

# Which part writes a family, by the module that builds it: a module that registers an
# agent feature (lens_ebpf/agent/registry.py) writes as that feature, with no entry here;
# the modules below a feature's own (its program or collector code) and the services' own
# parts by these prefixes, the longest first; any other by its service.
WRITERS = {
    "agent/devices/system.py": "system",
    "agent/devices/gpu/": "gpu",
    "agent/devices/rdma/": "rdma",
    "agent/features/tuner.py": "tuner",
    "agent/tcp/": "tcp",
    "agent/processes/": "processes",
    "agent/containers/": "container_runtime",
    "agent/pods/kubelet.py": "kubelet",
    "agent/pods/podresources.py": "pod_resources",
    "agent/pods/": "kubernetes",
    "agent/net/": "agent (policy)",
    "agent/bpf/": "agent (BPF loader)",
    "agent/events.py": "agent (event bus)",
    "agent/stream/": "agent (gRPC, reporter)",
    "agent/metrics/": "agent (metric cache)",
    "agent/feature.py": "agent (features)",
    "agent/": "agent",
    "core/collector.py": "agent (periodic collectors)",
    "core/http.py": "both (HTTP server)",
    "core/runner.py": "both (periodic jobs)",
    "k8s/": "both (Kubernetes watches)",
    "recorder/ingest/": "recorder (ingest)",
    "recorder/training/": "recorder (training)",
    "recorder/remote_write/": "recorder (remote write)",
    "recorder/clusters.py": "recorder (clusters)",
    "recorder/storage.py": "recorder (storage)",
    "recorder/": "recorder",
}
GOLDEN_WRITERS = {"system.prom": "system", "gpu.prom": "gpu", "gpu_compat.prom": "gpu",
                  "gpu_compat_amdsmi.prom": "gpu", "rdma.prom": "rdma",
                  "network.prom": "tcp"}  # fmt: skip


@dataclass
class Family:
    name: str
    kind: str
    help: str
    labels: set[str] = field(default_factory=set)
    writer: str = ""
    source: str = ""
    total: bool = True  # a counter's samples end in _total (dcgm-exporter's do not)

    @property
    def unit(self) -> str:
        base = self.name.removesuffix("_total")
        return next((u for suffix, u in UNITS if base.endswith(suffix)), "")


def feature_modules() -> dict[str, str]:
    """lens_ebpf-relative path of each module that registers an agent feature -> its name."""
    from lens_ebpf.agent.registry import FEATURES

    out = {}
    for info in FEATURES.registered():
        module = sys.modules[info.cls.__module__].__file__ or ""
        out[Path(module).resolve().relative_to(PACKAGE).as_posix()] = info.name
    return out


def writer_of(rel: str, features: dict[str, str]) -> str:
    if rel in features:
        return features[rel]
    for prefix, writer in sorted(WRITERS.items(), key=lambda pw: -len(pw[0])):
        if rel.startswith(prefix):
            return writer
    return {"agent": "agent", "recorder": "recorder"}.get(rel.split("/")[0], "both")


def golden_writer(name: str, features: dict[str, str]) -> str:
    """A golden file's feature: named in GOLDEN_WRITERS, else the feature its name starts
    with (`<feature>.prom`, `<feature>_<variant>.prom`)."""
    if name in GOLDEN_WRITERS:
        return GOLDEN_WRITERS[name]
    stem = name.removesuffix(".prom")
    known = set(features.values())
    return next((f for f in sorted(known, key=len, reverse=True)
                 if stem == f or stem.startswith(f + "_")), stem)  # fmt: skip


# -- 1. the golden expositions -------------------------------------------------------------
def parse_exposition(text: str) -> dict[str, Family]:
    """Families of a Prometheus text exposition: HELP, TYPE and the labels of its samples."""
    fams: dict[str, Family] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            fams.setdefault(name, Family(name, "untyped", "")).help = help_text
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            fams.setdefault(name, Family(name, kind, "")).kind = kind
        elif line and not line.startswith("#"):
            sample, _, rest = line.partition("{")
            fam = next((f for n, f in fams.items() if sample in (n, *suffixed(n))), None)
            if fam is not None and rest:
                fam.labels |= set(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', rest)) - {"le"}
    out: dict[str, Family] = {}
    for fam in fams.values():  # a counter by its family name: its samples add _total
        if fam.kind == "counter":
            fam.total = fam.name.endswith("_total")
            fam.name = fam.name.removesuffix("_total")
        out[fam.name] = fam
    return out


def suffixed(name: str) -> tuple[str, ...]:
    return tuple(name + s for s in ("_total", "_bucket", "_count", "_sum", "_created", "_info"))


def golden_families() -> Iterator[Family]:
    features = feature_modules()
    gpu_source = (PACKAGE / "agent/devices/gpu/collector.py").read_text()
    plain = set(parse_exposition((GOLDEN / "gpu.prom").read_text()))
    for path in sorted(GOLDEN.glob("*.prom")):
        for fam in parse_exposition(path.read_text()).values():
            fam.writer = golden_writer(path.name, features)
            fam.source = f"tests/golden/{path.name}"
            compat = path.name.startswith("gpu_compat") and fam.name not in plain
            if compat and f'"{fam.name}' not in gpu_source:  # always-on names: the gpu's own
                fam.writer = "gpu, compat " + ("dcgm" if fam.name.startswith("DCGM_") else "amd")
            yield fam


# -- 2. the TCP feature's cache families ---------------------------------------------------
def cache_families() -> Iterator[Family]:
    from lens_ebpf.agent.metrics.cache import MetricCache
    from lens_ebpf.agent.tcp import tcp_flows, tcp_rtt

    cache = MetricCache(60, 10)
    tcp_flows.register_families(cache)
    tcp_rtt.register_families(cache)  # the BTF path's help (a sample per period)
    for fam, _ in cache.snapshot():
        name = fam.name.removesuffix("_total") if fam.kind == "counter" else fam.name
        yield Family(name, fam.kind, fam.help, set(fam.labelnames), "tcp",
                     "tcp_flows/tcp_rtt.register_families")  # fmt: skip


# -- 3. the code that builds the others ----------------------------------------------------
class Partial(str):
    """An f-string's literal parts only: good enough for a help text, never for a name."""


class Constants:
    """Module-level names bound to strings or tuples of strings, for labels and tables."""

    def __init__(self, tree: ast.Module) -> None:
        self.values: dict[str, object] = {}
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name):
                    got = self.eval(node.value)
                    if got is not None:
                        self.values[target.id] = got

    def eval(self, node: ast.AST | None, local: dict[str, object] | None = None) -> object:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            if local and node.id in local:
                return local[node.id]
            if node.id in CLASSES:
                return CLASSES[node.id]  # a table row naming a family's class: its type
            return self.values.get(node.id, KINDS.get(node.id))
        if isinstance(node, ast.Tuple | ast.List):
            out: list[object] = []
            for elt in node.elts:
                if isinstance(elt, ast.Starred):
                    inner = self.eval(elt.value, local)
                    if not isinstance(inner, tuple):
                        return None
                    out.extend(inner)
                else:
                    out.append(self.eval(elt, local))
            return tuple(out)
        if isinstance(node, ast.JoinedStr):  # whole where a table row fills it, else Partial
            parts = [v.value if isinstance(v, ast.Constant) else
                     self.eval(v.value, local) if isinstance(v, ast.FormattedValue) else None
                     for v in node.values]  # fmt: skip
            text = "".join(x for x in parts if isinstance(x, str))
            whole = all(isinstance(x, str) and not isinstance(x, Partial) for x in parts)
            return text if whole else Partial(text)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            a, b = self.eval(node.left, local), self.eval(node.right, local)
            return a + b if isinstance(a, str) and isinstance(b, str) else None
        return None


def call_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def bindings(fn: ast.AST, consts: Constants) -> dict[int, list[dict[str, object]]]:
    """Call (by id) -> the rows of the `for a, b, ... in <literal table>` loops around it."""
    out: dict[int, list[dict[str, object]]] = {}
    for loop in ast.walk(fn):
        if isinstance(loop, ast.For | ast.ListComp | ast.DictComp | ast.GeneratorExp):
            gens = [loop] if isinstance(loop, ast.For) else loop.generators
            rows = table_rows(gens, consts)  # type: ignore[arg-type]
            if rows:
                for node in ast.walk(loop):
                    if isinstance(node, ast.Call):
                        out.setdefault(id(node), []).extend(rows)
    return out


def table_rows(
    gens: list[ast.For | ast.comprehension], consts: Constants
) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for node in gens:
        if isinstance(node.target, ast.Tuple):
            names = [t.id if isinstance(t, ast.Name) else "" for t in node.target.elts]
            table = consts.eval(node.iter) if isinstance(node.iter, ast.Name) else node.iter
            if isinstance(table, ast.Tuple | ast.List):
                for row in table.elts:
                    if isinstance(row, ast.Tuple) and len(row.elts) == len(names):
                        rows.append(
                            {n: consts.eval(v) for n, v in zip(names, row.elts, strict=False) if n}
                        )
            elif isinstance(table, tuple):  # a module's table of literals
                for values in table:
                    if isinstance(values, tuple) and len(values) == len(names):
                        rows.append({n: v for n, v in zip(names, values, strict=False) if n})
    return rows


def families_in(fn: ast.AST, consts: Constants) -> Iterator[tuple[Family, str | None]]:
    """Each family fn builds, and the variable it is bound to (for its add_sample calls)."""
    around = bindings(fn, consts)
    targets: dict[int, str] = {}
    for node in ast.walk(fn):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):  # fmt: skip
            targets[id(node.value)] = node.targets[0].id
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call) or len(node.args) < 2:
            continue
        fname, args = call_name(node), node.args
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        if fname == "watch_metrics":
            yield from watch_families(node, consts)
            continue
        spec = family_spec(fname, args, kw, consts)
        if spec is None:
            continue
        if fname == "JobMetrics":
            yield from job_families(node, consts)
            continue
        rows = around.get(id(node), [])
        for row in rows or [{}]:
            got = [consts.eval(a, row) if isinstance(a, ast.AST) else a for a in spec]
            name, help_text, kind, labels = got
            if isinstance(node.func, ast.Name) and node.func.id in row:
                kind = row[node.func.id]  # family(name, help) with family a table's class
            if isinstance(name, Partial) or not isinstance(name, str) or not NAME.match(name) \
                    or kind not in KINDS.values():  # fmt: skip
                continue
            if kind == "counter":
                name = name.removesuffix("_total")
            fam = Family(name, str(kind), help_text if isinstance(help_text, str) else "")
            if isinstance(labels, tuple):
                fam.labels = {x for x in labels if isinstance(x, str)}
            elif isinstance(labels, str):
                fam.labels = {labels}
            elif isinstance(labels, ast.AST):  # a helper's labels argument
                fam.labels = label_keys(labels, assigned(fn), consts)
            yield fam, targets.get(id(node))
            if not rows or not any(isinstance(a, ast.Name) and a.id in row for a in spec):
                break  # a literal family: once, whatever the table


HELPERS = {"counter": "counter", "_counter": "counter", "gauge": "gauge", "_gauge": "gauge",
           "histogram": "histogram", "add": "gauge"}  # fmt: skip


def family_spec(fname: str, args: list[ast.expr], kw: dict[str, ast.expr],
                consts: Constants) -> tuple[object, ...] | None:  # fmt: skip
    """(name, help, type, labels) nodes or values of a call that builds a family, else None."""
    if fname in CLASSES:
        return (args[0], args[1], CLASSES[fname], kw.get("labels"))
    if fname == "Metric" and len(args) >= 3:
        return (args[0], args[1], args[2], None)
    if fname == "register" and len(args) >= 3:  # MetricCache.register
        return (args[0], args[2], args[1], args[3] if len(args) > 3 else kw.get("labelnames"))
    if fname in HELPERS:  # the modules' small helpers: (name, [type,] help, [labels,] ...)
        rest = list(args[1:])
        kind: object = HELPERS[fname]
        if rest and consts.eval(rest[0]) in KINDS.values():
            kind = consts.eval(rest.pop(0))
        words = [consts.eval(a) for a in args[2:]] + [consts.eval(v) for v in kw.values()]
        kind = next((w for w in words if w in KINDS.values()), kind)
        labels = kw.get("label") or kw.get("labels") or next(
            (a for a in rest[1:] if isinstance(a, ast.Dict | ast.Name)), None)  # fmt: skip
        return (args[0], rest[0] if rest else None, kind, labels) if rest else None
    if isinstance(fname, str) and fname and len(args) >= 2:
        return (args[0], args[1], None, None)  # family(name, help): a table row's class
    return None


def watch_families(call: ast.Call, consts: Constants) -> Iterator[tuple[Family, None]]:
    """k8s/reflector.watch_metrics, run on a stand-in watch: the families it names."""
    from types import SimpleNamespace

    from lens_ebpf.k8s.reflector import watch_metrics

    names = [consts.eval(a) for a in call.args[1:4]]
    if not all(isinstance(n, str) for n in names):
        return
    watch = SimpleNamespace(resource="pods", connected=True, restarts={"gone": 1},
                            events={"ADDED": 1})  # fmt: skip
    for m in watch_metrics([watch], *names):  # type: ignore[list-item,arg-type]
        yield (
            Family(m.name, m.type, m.documentation, {k for s in m.samples for k in s.labels}),
            None,
        )


def job_families(call: ast.Call, consts: Constants) -> Iterator[tuple[Family, None]]:
    """core/runner.JobMetrics under the prefix a service gives it, run on a stand-in job."""
    from types import SimpleNamespace

    from lens_ebpf.core.runner import JobMetrics

    prefix = consts.eval(call.args[1]) if len(call.args) > 1 else None
    if not isinstance(prefix, str) or isinstance(prefix, Partial):
        return

    class State:
        def __getattr__(self, name: str) -> float:
            return 0.0

    runner = SimpleNamespace(state={"job": State()}, jobs={})
    for m in JobMetrics(runner, prefix).collect():  # type: ignore[arg-type]
        yield (
            Family(m.name, m.type, m.documentation, {k for s in m.samples for k in s.labels}),
            None,
        )


def assigned(fn: ast.AST) -> dict[str, ast.AST]:
    """Names bound in fn, to what (the last binding wins)."""
    return {n.targets[0].id: n.value for n in ast.walk(fn) if isinstance(n, ast.Assign)
            and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)}  # fmt: skip


def sample_labels(fn: ast.AST, var: str, consts: Constants) -> set[str]:
    """Label names of the add_sample/add_metric calls on var in fn (literal keys)."""
    out: set[str] = set()
    dicts = assigned(fn)
    for node in ast.walk(fn):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == var
                and node.func.attr == "add_sample" and len(node.args) >= 2):  # fmt: skip
            out |= label_keys(node.args[1], dicts, consts)
    return out


def label_keys(
    node: ast.AST, dicts: dict[str, ast.AST], consts: Constants, depth: int = 0
) -> set[str]:
    """The keys a labels argument certainly has: a dict literal (its ** spreads of names
    bound to dicts in the function too), such a name, or dict(zip(<constant tuple>, ...))."""
    if depth > 3:
        return set()
    if isinstance(node, ast.Name) and node.id in dicts:
        return label_keys(dicts[node.id], dicts, consts, depth + 1)
    if isinstance(node, ast.Dict):
        out: set[str] = set()
        for k, v in zip(node.keys, node.values, strict=False):
            if k is None:
                out |= label_keys(v, dicts, consts, depth + 1)
            elif isinstance(k, ast.Constant) and isinstance(k.value, str):
                out.add(k.value)
        return out
    if isinstance(node, ast.Call) and call_name(node) == "dict" and node.args:
        z = node.args[0]
        if isinstance(z, ast.Call) and call_name(z) == "zip" and z.args:
            keys = consts.eval(z.args[0])
            if isinstance(keys, tuple):
                return {k for k in keys if isinstance(k, str)}
    return set()


def code_families() -> Iterator[Family]:
    features = feature_modules()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if "/gen/" in rel or "/migrations/" in rel:
            continue
        tree = ast.parse(path.read_text())
        consts = Constants(tree)
        fns = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
        seen: set[str] = set()
        for fn in fns:
            for fam, var in families_in(fn, consts):
                if fam.name in seen:
                    continue
                seen.add(fam.name)
                if var:
                    fam.labels |= sample_labels(fn, var, consts)
                fam.writer, fam.source = writer_of(rel, features), f"lens_ebpf/{rel}"
                yield fam


# -- the page ------------------------------------------------------------------------------
def collect() -> dict[str, Family]:
    fams: dict[str, Family] = {}
    code = {f.name: f for f in code_families()}
    for fam in (*golden_families(), *cache_families(), *code.values()):
        have = fams.setdefault(fam.name, fam)
        have.labels |= fam.labels
    for name, fam in code.items():  # the module that builds it says who writes it
        if not fams[name].writer.startswith(fam.writer.split(",")[0]):
            fams[name].writer = fam.writer
    return fams


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def exported(fam: Family) -> str:
    """The name its samples (a histogram's: their stem) and its TYPE line carry."""
    return fam.name + "_total" if fam.kind == "counter" and fam.total else fam.name


def render(fams: dict[str, Family]) -> str:
    agent = {n: f for n, f in fams.items() if not f.writer.startswith("recorder")}
    recorder = {n: f for n, f in fams.items() if f.writer.startswith("recorder")}
    out = [
        "# Metric reference",
        "",
        "<!-- Generated by scripts/metrics_reference.py (make docs); do not edit. -->",
        "",
        f"Every metric family the agent and the recorder can export: {len(fams)} families "
        f"({len(agent)} of the agent, {len(recorder)} of the recorder), named as the "
        "exposition writes them (a counter with `_total`, dcgm-exporter's as it does). "
        "The unit comes from the name's base-unit suffix "
        "([conventions](metric-conventions.md)); labels are those the code writes "
        "(a histogram's `le` left out). *Written by* names the agent feature "
        "(`collectors.<key>`, [features](../agent/index.md)), the GPU compat set "
        "(`devices.compat: [amd, dcgm]`, [compat](../agent/compat.md)) or the part of the "
        "service that writes it.",
        "",
        "How each family was found: from a golden exposition (`tests/golden/*.prom`: the "
        "collector run on the repo's fixtures), from the metric cache the TCP feature "
        "registers its families in, or from the code that builds it (its name a literal or "
        "a row of a literal table). A family whose series exist only with data (a fault, an "
        "error reason) is listed all the same.",
        "",
    ]
    for title, part in (("The agent", agent), ("The recorder", recorder)):
        out += [f"## {title}", "", "| name | type | unit | labels | written by | help |",
                "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        for name in sorted(part, key=str.lower):
            f = part[name]
            labels = ", ".join(f"`{x}`" for x in sorted(f.labels))
            out.append(f"| `{exported(f)}` | {f.kind} | {f.unit} | {labels} | {f.writer} | "
                       f"{cell(f.help)} |")  # fmt: skip
        out.append("")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    text = render(collect())
    if "--check" in argv:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"{PAGE.relative_to(ROOT)} is stale: run python scripts/metrics_reference.py")
            return 1
        return 0
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
