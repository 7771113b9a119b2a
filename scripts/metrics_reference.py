"""Writes docs/reference/metrics.md: every metric family the agent and the recorder export.

Three sources, each the code's own, merged by family name (the first that knows a family
wins, in this order):

1. the golden expositions (tests/golden/*.prom): the device collectors (system, gpu and its
   compat sets, rdma) and the network families run on the repo's fixtures, compared byte
   for byte with the code by their tests; families built from tables (rdma port counters,
   `rdma_stat_<counter>`, AMD's ECC blocks) are only known by running them;
2. the families the TCP feature registers in the agent's metric cache (its programs run in
   the kernel; registering them needs neither root nor BPF);
3. every other family, read from the code that builds it: each `Family(...)` (the one
   way, core/exposition.py; `Metric(...)` and `*MetricFamily(...)` read the same) and
   `cache.register(...)` whose name is a literal or a `for` over a literal table (inline,
   a module's, a dict's items()), and each call of a helper that builds one from its
   arguments, itself or through another (exposition's counter(), gauge(), histogram(),
   family(); `_family(name, help, kind)`, `add(name, ...)`), read as the helper's body
   with the call's arguments. Its labels from the `labels=` it is given and the calls
   that put its samples (`add`, `add_buckets`, `add_sample`) on it (the helper's, the
   variable it is bound to, `x[k]` of a dict of families): a dict literal and its
   ** spreads, a name bound to one here, in the function around, or by every caller of
   the function (a parameter), a function that returns one, dict(zip(<literal tuple>, ...)).

python scripts/metrics_reference.py writes the page; --check exits 1 when it differs
(tests/unit/test_docs.py runs that check).
"""

from __future__ import annotations

import ast
import builtins
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PAGE = ROOT / "docs" / "reference" / "metrics.md"
GOLDEN = ROOT / "tests" / "golden"
PACKAGE = ROOT / "lens_ebpf"
NAME = re.compile(r"^[a-zA-Z][a-zA-Z0-9_]*_[a-zA-Z0-9]+$")
KINDS = {"COUNTER": "counter", "GAUGE": "gauge", "HISTOGRAM": "histogram"}
CLASSES = {
    "CounterMetricFamily": "counter",
    "GaugeMetricFamily": "gauge",
    "HistogramMetricFamily": "histogram",
    "SummaryMetricFamily": "summary",
    "InfoMetricFamily": "info",
}
# base-unit suffixes (docs/reference/metric-conventions.md), longest first
UNITS = (
    ("_bytes_per_second", "bytes/s"),
    ("_seconds", "seconds"),
    ("_bytes", "bytes"),
    ("_joules", "joules"),
    ("_watts", "watts"),
    ("_celsius", "°C"),
    ("_ratio", "ratio"),
    ("_percent", "percent"),
    ("_mhz", "MHz"),
    ("_mbs", "Mb/s"),
)

# Which part writes a family, by the module that builds it: a module that registers an
# agent feature (lens_ebpf/agent/registry.py) writes as that feature, with no entry here;
# the modules below a feature's own (its program or collector code) and the services' own
# parts by these prefixes, the longest first; any other by its service.
WRITERS = {
    "agent/devices/system.py": "system",
    "agent/devices/gpu/": "gpu",
    "agent/devices/gpu/compat_amd.py": "gpu, compat amd",
    "agent/devices/gpu/compat_dcgm.py": "gpu, compat dcgm",
    "agent/devices/rdma/": "rdma",
    "agent/features/tuner.py": "tuner",
    "agent/tcp/": "tcp",
    "agent/processes/": "processes",
    "agent/drops/": "drops",
    "agent/containers/": "container_runtime",
    "agent/pods/kubelet.py": "kubelet",
    "agent/pods/podresources.py": "pod_resources",
    "agent/pods/": "kubernetes",
    "agent/net/": "agent (policy)",
    "agent/bpf/": "agent (BPF loader)",
    "agent/events.py": "agent (event bus)",
    "agent/stream/": "agent (gRPC, reporter)",
    "agent/otlp/": "otlp",
    "agent/metrics/": "agent (metric cache)",
    "agent/feature.py": "agent (features)",
    "agent/": "agent",
    "core/collector.py": "agent (periodic collectors)",
    # HttpServer serves both services, but only the agent registers its collector
    # (agent/service.py: self.http.collector()); tests/unit/test_docs.py holds that
    "core/http.py": "agent (HTTP server)",
    "core/runner.py": "both (periodic jobs)",
    "k8s/": "both (Kubernetes watches)",
    "recorder/ingest/": "recorder (ingest)",
    "recorder/ingest/leadership.py": "recorder",  # the leader election, not the ingest's
    "recorder/api/front.py": "recorder (HTTP server)",
    "recorder/training/": "recorder (training)",
    "recorder/remote_write/": "recorder (remote write)",
    "recorder/tracker/clusters.py": "recorder (clusters)",
    "recorder/storage.py": "recorder (storage)",
    "recorder/": "recorder",
}
GOLDEN_WRITERS = {
    "system.prom": "system",
    "gpu.prom": "gpu",
    "gpu_compat.prom": "gpu",
    "gpu_compat_amdsmi.prom": "gpu",
    "rdma.prom": "rdma",
    "network.prom": "tcp",
}


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
    return next(
        (f for f in sorted(known, key=len, reverse=True) if stem == f or stem.startswith(f + "_")),
        stem,
    )


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
    gpu = PACKAGE / "agent/devices/gpu"  # the GPU's own names: its collector and families
    gpu_source = (gpu / "collector.py").read_text() + (gpu / "families.py").read_text()
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
    from lens_ebpf.agent.tcp import connect_latency, flow_families, tcp_rtt

    cache = MetricCache(60, 10)
    flow_families.register_families(cache)
    connect_latency.register_families(cache)
    tcp_rtt.register_families(cache)  # the BTF path's help (a sample per period)
    for fam, _ in cache.snapshot():
        name = fam.name.removesuffix("_total") if fam.kind == "counter" else fam.name
        yield Family(
            name,
            fam.kind,
            fam.help,
            set(fam.labelnames),
            "tcp",
            "flow_families/tcp_rtt/connect_latency.register_families",
        )


# -- 3. the code that builds the others ----------------------------------------------------
class Partial(str):
    """An f-string's literal parts only: good enough for a help text, never for a name."""


class Constants:
    """Module-level names bound to literals: strings, numbers, and tuples or dicts of them
    (the tables families are built from)."""

    def __init__(self, tree: ast.Module) -> None:
        self.values: dict[str, object] = {}
        for node in tree.body:
            target, value = None, None
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            elif isinstance(node, ast.AnnAssign):
                target, value = node.target, node.value
            if isinstance(target, ast.Name) and value is not None:
                got = self.eval(value)
                if got is not None:
                    self.values[target.id] = got

    def eval(self, node: ast.AST | None) -> object:
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str | int | float)
            and not isinstance(node.value, bool)
        ):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in CLASSES:
                return CLASSES[node.id]  # a table row naming a family's class: its type
            if node.id in ("counter", "gauge"):
                return node.id  # or core.exposition's function that builds one
            return self.values.get(node.id, KINDS.get(node.id))
        if isinstance(node, ast.Tuple | ast.List):
            out: list[object] = []
            for elt in node.elts:
                if isinstance(elt, ast.Starred):
                    inner = self.eval(elt.value)
                    if not isinstance(inner, tuple):
                        return None
                    out.extend(inner)
                else:
                    out.append(self.eval(elt))
            return tuple(out)
        if isinstance(node, ast.Dict) and all(isinstance(k, ast.Constant) for k in node.keys):
            return {
                k.value: self.eval(v)
                for k, v in zip(node.keys, node.values, strict=True)
                if isinstance(k, ast.Constant)
            }
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "items"
            and not node.args
        ):
            table = self.eval(node.func.value)
            return tuple(table.items()) if isinstance(table, dict) else None
        if isinstance(node, ast.JoinedStr | ast.BinOp):
            return join(node, self.eval)
        return None


def join(node: ast.JoinedStr | ast.BinOp, value: Callable[[ast.AST], object]) -> object:
    """An f-string or a `+` of strings: whole where every part is known, else Partial."""
    if isinstance(node, ast.BinOp):
        if not isinstance(node.op, ast.Add):
            return None
        parts = [value(node.left), value(node.right)]
        if not all(isinstance(x, str) for x in parts):
            return None
    else:
        parts = [
            v.value
            if isinstance(v, ast.Constant)
            else value(v.value)
            if isinstance(v, ast.FormattedValue)
            else None
            for v in node.values
        ]
        parts = [str(x) if isinstance(x, int | float) else x for x in parts]
    text = "".join(x for x in parts if isinstance(x, str))
    whole = all(isinstance(x, str) and not isinstance(x, Partial) for x in parts)
    return text if whole else Partial(text)


def call_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


Def = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass
class Module:
    """One module of the package, parsed: its constants, functions and imports."""

    rel: str
    tree: ast.Module
    consts: Constants
    defs: dict[str, list[Def]] = field(default_factory=dict)  # every def, nested too
    parent: dict[int, Def] = field(default_factory=dict)  # a def or call (id) -> its def
    imports: dict[str, str] = field(default_factory=dict)  # name -> the module it is from
    calls: dict[int, list[ast.Call]] = field(default_factory=dict)  # def (id) -> its calls

    @classmethod
    def parse(cls, path: Path) -> Module:
        tree = ast.parse(path.read_text())
        mod = cls(path.relative_to(PACKAGE).as_posix(), tree, Constants(tree))
        todo: list[tuple[ast.AST, Def | None]] = [(tree, None)]
        while todo:  # each node with the innermost def around it
            node, around = todo.pop()
            if around is not None and isinstance(node, Def | ast.Call):
                mod.parent[id(node)] = around
            if isinstance(node, ast.Call):
                mod.calls.setdefault(id(around or tree), []).append(node)
            if isinstance(node, Def):
                mod.defs.setdefault(node.name, []).append(node)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lens_ebpf."):
                rel = (node.module or "").removeprefix("lens_ebpf.").replace(".", "/")
                for alias in node.names:
                    mod.imports[alias.asname or alias.name] = rel + ".py"
            inner = node if isinstance(node, Def) else around
            todo.extend((child, inner) for child in ast.iter_child_nodes(node))
        return mod


_MODULES: dict[str, Module] = {}


def modules() -> dict[str, Module]:
    """The package's modules (not generated code nor migrations), by lens_ebpf-relative path."""
    if not _MODULES:
        for path in sorted(PACKAGE.rglob("*.py")):
            rel = path.relative_to(PACKAGE).as_posix()
            if "/gen/" not in rel and "/migrations/" not in rel:
                _MODULES[rel] = Module.parse(path)
    return _MODULES


@dataclass
class Ctx:
    """Where an expression is read: its module, the function around it, the row of the
    literal table a loop binds, and (in a helper) the caller's arguments of its parameters."""

    mod: Module
    fn: ast.AST
    row: dict[str, object] = field(default_factory=dict)
    bound: dict[str, tuple[ast.AST, Ctx]] = field(default_factory=dict)

    def outer(self) -> Ctx | None:
        up = self.mod.parent.get(id(self.fn))
        return Ctx(self.mod, up) if up is not None else None


def params_of(fn: ast.AST) -> list[str]:
    if not isinstance(fn, Def):
        return []
    a = fn.args
    return [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]


def assigned(fn: ast.AST) -> dict[str, list[ast.AST]]:
    """Names bound in fn, to what (every binding)."""
    out: dict[str, list[ast.AST]] = {}
    for n in ast.walk(fn):
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            out.setdefault(n.targets[0].id, []).append(n.value)
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.value:
            out.setdefault(n.target.id, []).append(n.value)
    return out


def bind(call: ast.Call, fn: Def, caller: Ctx, mod: Module) -> dict[str, tuple[ast.AST, Ctx]]:
    """fn's parameters -> the call's arguments (in the caller) or their defaults (in fn's
    scope)."""
    a = fn.args
    positional = [p.arg for p in (*a.posonlyargs, *a.args)]
    home = Ctx(mod, mod.parent.get(id(fn), mod.tree))
    out: dict[str, tuple[ast.AST, Ctx]] = {}
    for p, d in zip(positional[len(positional) - len(a.defaults) :], a.defaults, strict=True):
        out[p] = (d, home)
    for kwarg, default in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        if default is not None:
            out[kwarg.arg] = (default, home)
    if positional[:1] in (["self"], ["cls"]) and isinstance(call.func, ast.Attribute):
        positional = positional[1:]
    for p, arg in zip(positional, call.args, strict=False):
        if isinstance(arg, ast.Starred):
            break
        out[p] = (arg, caller)
    out.update({k.arg: (k.value, caller) for k in call.keywords if k.arg})
    return out


def resolve(name: str, ctx: Ctx) -> list[tuple[ast.AST, Ctx]]:
    """What name may stand for where ctx reads it: a helper's argument, a binding in the
    function or (a closure) in the functions around it."""
    if name in ctx.bound:
        return [ctx.bound[name]]
    if name in params_of(ctx.fn):
        return []  # an argument nobody gave here (label_keys asks the callers)
    got = assigned(ctx.fn).get(name)
    if got:
        return [(v, ctx) for v in got]
    up = ctx.outer()
    return resolve(name, up) if up is not None else []


def value(node: ast.AST | None, ctx: Ctx, depth: int = 0) -> object:
    """The literal an expression certainly has where ctx reads it, else None."""
    if node is None or depth > 8:
        return None
    if isinstance(node, ast.Name):
        if node.id in ctx.row:
            return ctx.row[node.id]
        for v, c in resolve(node.id, ctx):
            got = value(v, c, depth + 1)
            if got is not None:
                return got
        if node.id in ctx.bound or node.id in params_of(ctx.fn):
            return None
        return ctx.mod.consts.eval(node)
    if isinstance(node, ast.JoinedStr | ast.BinOp):
        return join(node, lambda n: value(n, ctx, depth + 1))
    if isinstance(node, ast.IfExp):
        got = value(node.body, ctx, depth + 1)
        return got if got is not None else value(node.orelse, ctx, depth + 1)
    affixes = ("removesuffix", "removeprefix")
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in affixes
        and len(node.args) == 1
    ):
        text, affix = value(node.func.value, ctx, depth + 1), value(node.args[0], ctx, depth + 1)
        if isinstance(text, str) and not isinstance(text, Partial) and isinstance(affix, str):
            return getattr(text, node.func.attr)(affix)
        return None
    if isinstance(node, ast.Tuple | ast.List):
        out: list[object] = []
        for elt in node.elts:
            if isinstance(elt, ast.Starred):
                inner = value(elt.value, ctx, depth + 1)
                if not isinstance(inner, tuple):
                    return None
                out.extend(inner)
            else:
                out.append(value(elt, ctx, depth + 1))
        return tuple(out)
    return ctx.mod.consts.eval(node)


def label_keys(node: ast.AST | None, ctx: Ctx, depth: int = 0) -> set[str]:
    """The label names a labels expression has where ctx reads it: a dict literal (its **
    spreads too), a name bound to one (here, around, or by every caller), a helper's
    argument, a call of a function that returns one, dict(zip(<literal tuple>, ...)),
    or a tuple of names (labels=, labelnames)."""
    out: set[str] = set()
    if node is None or depth > 8:
        return out
    if isinstance(node, ast.Name):
        for v, c in resolve(node.id, ctx) or callers_args(node.id, ctx):
            out |= label_keys(v, c, depth + 1)
        return out | updated_keys(node.id, ctx, depth)
    if isinstance(node, ast.Dict):
        for k, v in zip(node.keys, node.values, strict=True):
            key = value(k, ctx) if k is not None else None
            if k is None:
                out |= label_keys(v, ctx, depth + 1)
            elif isinstance(key, str) and key and not isinstance(key, Partial):
                out.add(key)
        return out
    if isinstance(node, ast.IfExp):
        return label_keys(node.body, ctx, depth + 1) | label_keys(node.orelse, ctx, depth + 1)
    if isinstance(node, ast.BoolOp):
        return set().union(*(label_keys(v, ctx, depth + 1) for v in node.values))
    if isinstance(node, ast.Tuple | ast.List):
        names = value(node, ctx)
        return {x for x in names if isinstance(x, str)} if isinstance(names, tuple) else out
    if isinstance(node, ast.Call):
        if call_name(node) == "dict":
            z = node.args[0] if node.args else None
            if isinstance(z, ast.Call) and call_name(z) == "zip" and z.args:
                out |= label_keys(z.args[0], ctx, depth + 1)
            return out | {k.arg for k in node.keywords if k.arg}
        for fn, mod in defs_called(node, ctx):  # a function that returns the labels
            inner = Ctx(mod, fn, {}, bind(node, fn, ctx, mod))
            for ret in ast.walk(fn):
                if isinstance(ret, ast.Return):
                    out |= label_keys(ret.value, inner, depth + 1)
    return out


def callers_args(name: str, ctx: Ctx) -> list[tuple[ast.AST, Ctx]]:
    """A parameter nobody bound here: the arguments the module's calls of its function give."""
    fn = ctx.fn
    if not isinstance(fn, Def) or name not in params_of(fn):
        return []
    out = []
    for node in ast.walk(ctx.mod.tree):
        if isinstance(node, ast.Call) and call_name(node) == fn.name:
            caller = Ctx(ctx.mod, ctx.mod.parent.get(id(node), ctx.mod.tree))
            bound = bind(node, fn, caller, ctx.mod)
            if name in bound:
                out.append(bound[name])
    return out


def updated_keys(name: str, ctx: Ctx, depth: int) -> set[str]:
    """Keys name's dict gains in the function: name.update(k=...), name["k"] = ..."""
    out: set[str] = set()
    for node in ast.walk(ctx.fn):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "update"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == name
        ):
            out |= {k.arg for k in node.keywords if k.arg}
            for arg in node.args:
                out |= label_keys(arg, ctx, depth + 1)
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if (
                    isinstance(t, ast.Subscript)
                    and isinstance(t.value, ast.Name)
                    and t.value.id == name
                ):
                    key = value(t.slice, ctx)
                    if isinstance(key, str):
                        out.add(key)
    return out


def defs_called(call: ast.Call, ctx: Ctx) -> list[tuple[Def, Module]]:
    """The defs a call may run: nested in the functions around it, the module's own (a
    method by its name), or one imported from another module of the package."""
    name = call_name(call)
    if (
        not name
        or isinstance(call.func, ast.Attribute)
        and not (isinstance(call.func.value, ast.Name) and call.func.value.id in ("self", "cls"))
    ):
        return []
    mod, found = ctx.mod, ctx.mod.defs.get(name, [])
    scopes = []
    c: Ctx | None = ctx
    while c is not None:
        scopes.append(c.fn)
        c = c.outer()
    near = [d for d in found if mod.parent.get(id(d)) in scopes]
    top = [d for d in found if not isinstance(mod.parent.get(id(d)), Def)]
    if near or top:
        return [(d, mod) for d in near or top]
    other = modules().get(mod.imports.get(name, ""))
    if other is None:
        return []
    return [(d, other) for d in other.defs.get(name, []) if id(d) not in other.parent]


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
    """The names a loop over a literal table (inline, a module's, or a dict's items())
    binds, one dict per row; nested targets (`for k, (a, b) in T.items()`) too."""
    rows: list[dict[str, object]] = []
    for node in gens:
        table = consts.eval(node.iter) if isinstance(node.target, ast.Tuple) else None
        if isinstance(table, tuple):
            rows += [r for r in (destructure(node.target, v) for v in table) if r is not None]
    return rows


def destructure(target: ast.AST, values: object) -> dict[str, object] | None:
    if isinstance(target, ast.Name):
        return {target.id: values}
    if (
        isinstance(target, ast.Tuple)
        and isinstance(values, tuple)
        and len(values) == len(target.elts)
    ):
        out: dict[str, object] = {}
        for t, v in zip(target.elts, values, strict=True):
            got = destructure(t, v)
            if got is None:
                return None
            out.update(got)
        return out
    return None


BUILDERS = {"Metric", "Family", "register", *CLASSES}
RUN = {"watch_metrics", "JobMetrics"}  # run on a stand-in, not read (families_in)


def build(call: ast.Call, ctx: Ctx) -> Family | None:
    """The family a call that builds one makes, where ctx reads it; None where its name
    is not certain (a name made at run time, a helper's own body)."""
    fname, args = call_name(call), call.args
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    labels: ast.AST | None = None
    kind: object
    if fname in CLASSES:
        name, help_node, kind, labels = (
            args[0] if args else kw.get("name"),
            args[1] if len(args) > 1 else kw.get("documentation"),
            CLASSES[fname],
            kw.get("labels"),
        )
    elif fname in ("Metric", "Family") and len(args) >= 3:
        name, help_node, kind = args[0], args[1], value(args[2], ctx)
    elif fname == "register" and len(args) >= 3:  # MetricCache.register
        name, help_node, kind = args[0], args[2], value(args[1], ctx)
        labels = args[3] if len(args) > 3 else kw.get("labelnames")
    elif isinstance(call.func, ast.Name) and call.func.id in ctx.row and len(args) >= 2:
        name, help_node, kind = args[0], args[1], ctx.row[call.func.id]  # a table's class
    else:
        return None
    got, help_text = value(name, ctx), value(help_node, ctx)
    if (
        isinstance(got, Partial)
        or not isinstance(got, str)
        or not NAME.match(got)
        or kind not in KINDS.values()
    ):
        return None
    if kind == "counter":
        got = got.removesuffix("_total")
    fam = Family(got, str(kind), help_text if isinstance(help_text, str) else "")
    fam.labels = label_keys(labels, ctx) if labels is not None else set()
    return fam


def helper_families(call: ast.Call, ctx: Ctx, depth: int = 0) -> Iterator[Family]:
    """The families a helper (a function whose body builds a family from its arguments,
    itself or through another helper: core.exposition's gauge()) makes for this call; their
    labels from the labels its body gives them."""
    for fn, mod in defs_called(call, ctx):
        inner = Ctx(mod, fn, {}, bind(call, fn, ctx, mod))
        for node in ast.walk(fn):
            if (
                not isinstance(node, ast.Call)
                or not node.args
                or isinstance(node.args[0], ast.Constant)
            ):
                continue
            if call_name(node) in BUILDERS:
                fam = build(node, inner)
                fams = [fam] if fam is not None else []
            elif depth < 2 and call_name(node) not in RUN:
                fams = list(helper_families(node, inner, depth + 1))
            else:
                fams = []
            for fam in fams:
                fam.labels |= samples_labels(fn, None, inner)
                yield fam


def families_in(fn: ast.AST, mod: Module) -> Iterator[tuple[Family, str | None]]:
    """Each family fn builds (itself or through a helper), and the variable it is bound to
    (for its add_sample calls)."""
    wanted = BUILDERS | {"watch_metrics", "JobMetrics"} | set(mod.defs) | set(mod.imports)
    if not any(
        call_name(c) in wanted or isinstance(c.func, ast.Name) and not hasattr(builtins, c.func.id)
        for c in mod.calls.get(id(fn), [])
    ):
        return  # nothing here builds a family (a table's class is a loop's name)
    around = bindings(fn, mod.consts)
    targets: dict[int, str] = {}
    for node in ast.walk(fn):  # x = Metric(...), x = {k: Metric(...) for ...}
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            for inner in ast.walk(node.value):
                if isinstance(inner, ast.Call):
                    targets.setdefault(id(inner), node.targets[0].id)
    for node in mod.calls.get(id(fn), []):
        fname = call_name(node)
        if fname == "watch_metrics":
            yield from watch_families(node, mod.consts)
            continue
        if fname == "JobMetrics":
            yield from job_families(node, mod.consts)
            continue
        rows = around.get(id(node), [])
        for row in rows or [{}]:
            ctx = Ctx(mod, fn, row)
            fam = build(node, ctx)
            fams = (
                [fam]
                if fam is not None
                else []
                if fname in BUILDERS
                else list(helper_families(node, ctx))
            )
            for fam in fams:
                yield fam, targets.get(id(node))


def watch_families(call: ast.Call, consts: Constants) -> Iterator[tuple[Family, None]]:
    """k8s/reflector.watch_metrics, run on a stand-in watch: the families it names."""
    from types import SimpleNamespace

    from lens_ebpf.k8s.reflector import watch_metrics

    names = [consts.eval(a) for a in call.args[1:4]]
    if not all(isinstance(n, str) for n in names):
        return
    watch = SimpleNamespace(
        resource="pods", connected=True, restarts={"gone": 1}, events={"ADDED": 1}
    )
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


# the methods that put a sample, by where their labels are: Metric.add_sample(name, labels,
# value), exposition.Family's add(labels, value) and add_buckets(labels, buckets, sum)
SAMPLES = {"add_sample": 1, "add": 0, "add_buckets": 0}


def samples_labels(fn: ast.AST, var: str | None, ctx: Ctx) -> set[str]:
    """Label names of the calls that put a sample in fn on var (var, var[...], or a loop name
    that takes var from a literal table); on any family where var is None."""
    names = {var} | aliases(fn, var) if var else set()
    out: set[str] = set()
    for node in ast.walk(fn):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in SAMPLES
            and len(node.args) > SAMPLES[node.func.attr]
        ):
            on = node.func.value
            on = on.value if isinstance(on, ast.Subscript) else on
            if var is None or isinstance(on, ast.Name) and on.id in names:
                out |= label_keys(node.args[SAMPLES[node.func.attr]], ctx)
    return out


def aliases(fn: ast.AST, var: str) -> set[str]:
    """Loop names bound to var: `for a, b in ((x, var), ...)` makes b var in that row."""
    out: set[str] = set()
    for loop in ast.walk(fn):
        if (
            isinstance(loop, ast.For)
            and isinstance(loop.target, ast.Tuple)
            and isinstance(loop.iter, ast.Tuple | ast.List)
        ):
            for row in loop.iter.elts:
                if isinstance(row, ast.Tuple) and len(row.elts) == len(loop.target.elts):
                    for t, v in zip(loop.target.elts, row.elts, strict=True):
                        if isinstance(v, ast.Name) and v.id == var and isinstance(t, ast.Name):
                            out.add(t.id)
    return out


def code_families() -> Iterator[Family]:
    features = feature_modules()
    for rel, mod in modules().items():
        fns = [mod.tree, *(n for n in ast.walk(mod.tree) if isinstance(n, Def))]
        seen: dict[str, Family] = {}
        for fn in fns:
            for fam, var in families_in(fn, mod):
                if var:
                    fam.labels |= samples_labels(fn, var, Ctx(mod, fn))
                if fam.name in seen:  # built twice (each branch): one family, every label
                    seen[fam.name].labels |= fam.labels
                    continue
                seen[fam.name] = fam
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
        "a row of a literal table, given to the family or to a helper that builds one). A "
        "family whose series exist only with data (a fault, an error reason) is listed all "
        "the same; one named after what the hardware reports (`rdma_stat_<counter>`, AMD's "
        "`gpu_ecc_<kind>_<block>`) as the fixtures name it.",
        "",
    ]
    for title, part in (("The agent", agent), ("The recorder", recorder)):
        out += [
            f"## {title}",
            "",
            "| name | type | unit | labels | written by | help |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for name in sorted(part, key=str.lower):
            f = part[name]
            labels = ", ".join(f"`{x}`" for x in sorted(f.labels))
            out.append(
                f"| `{exported(f)}` | {f.kind} | {f.unit} | {labels} | {f.writer} | "
                f"{cell(f.help)} |"
            )
        out.append("")
    return "\n".join(out + otlp_section(agent))


def otlp_section(agent: dict[str, Family]) -> list[str]:
    """How the agent's families go out over OTLP (collectors.otlp): their metric names,
    types, units, and whether a pod's labels name their resource (agent/otlp/metrics.py's
    own functions)."""
    from lens_ebpf.agent.otlp.metrics import otlp_name, pod_labels, unit

    types = {
        "counter": "Sum (cumulative, monotonic)",
        "gauge": "Gauge",
        "histogram": "Histogram (cumulative)",
        "summary": "Summary",
    }
    out = [
        "## Over OTLP",
        "",
        "With `collectors.otlp` ([OTLP out](../agent/otlp.md)) every agent family goes out "
        "as an OTLP metric: a counter a cumulative monotonic Sum named without `_total`, a "
        "gauge (an info, a state set, an untyped family) a Gauge, a histogram a cumulative "
        "Histogram with the same bounds, a summary a Summary; the unit (UCUM) from the "
        "name's base-unit suffix. Labels are the data points' attributes under the same "
        "names, but where a series' `namespace` and `pod` are set: then they, and "
        "`container`, `container_id`, `pod_uid`, a `workload_kind` with its `workload`, "
        "name the pod's resource (`k8s.namespace.name`, `k8s.pod.name`, "
        "`k8s.container.name`, `container.id`, `k8s.pod.uid`, `k8s.<kind>.name`). The "
        "node's resource has `host.name`, `k8s.node.name`, `service.name`.",
        "",
        "| exposition | OTLP metric | OTLP type, unit | to a pod's resource |",
        "| --- | --- | --- | --- |",
    ]
    for name in sorted(agent, key=str.lower):
        f = agent[name]
        kind = f.kind if f.kind in types else "gauge"
        moved = ", ".join(f"`{x}`" for x in pod_labels(f.labels))
        u = unit(exported(f))
        out.append(
            f"| `{exported(f)}` | `{otlp_name(exported(f), kind)}` | "
            f"{types[kind]}{', `' + u + '`' if u else ''} | {moved} |"
        )
    out.append("")
    return out


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
