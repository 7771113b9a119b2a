"""Log rules: evaluated on the lines POST /logs receives (on the leader, which takes every
replica's log lines), each a pattern (a regular expression searched in the line) or a
threshold (the pattern so many times within a window), over the lines its label
selectors pick (namespace, pod, node, workload), one alert per rule and group (the
workload by default: the ranks of a job that all print the same line fire it once) and
not again within the rule's repeat_interval (the suppressed counted).

The pages write a rule's config in one dialect (`flags.case_insensitive`,
`threshold.{count, window}`, selectors `{key, operator: "=", value}`), the original's
engine in another (`ignore_case`, `threshold.{count_threshold, time_window}`,
`{type, key, operator: "eq", values}`): both are read.

The shipped templates, stored on a first start, are logtemplates.py's.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, select, update

from lens_ebpf.recorder import inputs
from lens_ebpf.recorder.alerts import model, patterns
from lens_ebpf.recorder.alerts.ingest import AlertIn
from lens_ebpf.recorder.alerts.model import new_id
from lens_ebpf.recorder.errors import BadRequest, Conflict
from lens_ebpf.recorder.store import schema as t

MATCH_TYPES = ("pattern", "threshold")
GROUPS = ("workload", "pod", "node", "namespace", "cluster")
SELECTOR_KEYS = (
    "namespace",
    "pod",
    "pod_name",
    "node",
    "node_name",
    "workload",
    "workload_name",
    "workload_kind",
    "cluster",
    "cluster_name",
    "container",
)
OPS = {
    "=": "eq",
    "==": "eq",
    "eq": "eq",
    "!=": "ne",
    "ne": "ne",
    "=~": "regex",
    "regex": "regex",
    "!~": "notregex",
    "in": "in",
    "notin": "notin",
    "exists": "exists",
    "notexists": "notexists",
}
MESSAGE_MAX = 500


@dataclass(frozen=True)
class Line:
    """A log line with what it concerns (the tracker's pod and workload where known)."""

    at: datetime
    text: str
    namespace: str
    pod: str
    pod_uid: str
    container: str
    node: str = ""
    workload_uid: str = ""
    workload_name: str = ""
    workload_kind: str = ""
    cluster: str = ""

    def field(self, key: str) -> str:
        return {
            "namespace": self.namespace,
            "pod": self.pod,
            "pod_name": self.pod,
            "node": self.node,
            "node_name": self.node,
            "workload": self.workload_name,
            "workload_name": self.workload_name,
            "workload_kind": self.workload_kind,
            "cluster": self.cluster,
            "cluster_name": self.cluster,
            "container": self.container,
        }.get(key, "")


def duration_seconds(raw: Any, field: str = "match_config.threshold.time_window") -> int:
    """ "10m", "30s", "1h", or a number of seconds (at most nine digits)."""
    if isinstance(raw, int | float) and not isinstance(raw, bool) and 0 <= raw < 1e9:
        return int(raw)
    m = re.fullmatch(r"\s*([0-9]{1,9})\s*([smhd]?)\s*", str(raw or ""))
    if not m:
        raise BadRequest(f"{field}={raw!r}: a duration (30s, 10m, 1h) is required")
    return int(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


@dataclass
class Rule:
    id: int
    name: str
    cluster: str
    severity: str
    match_type: str
    pattern: Any  # RE2's (patterns.py), None for none
    count: int  # threshold: this many matches ...
    window: int  # ... within this many seconds
    selectors: list[tuple[str, str, list[str]]]
    group_by: list[str]
    repeat: int
    template: dict[str, Any]
    error: str = ""  # why it cannot match (a bad pattern)
    keywords: tuple[str, ...] = ()  # a line holds one of these (lower case) or cannot match


def compile_pattern(
    pattern: str, config: dict[str, Any], field: str = "match_config.pattern"
) -> Any:
    """The pattern in RE2 (patterns.py: linear in the line); BadRequest naming field."""
    flags = config.get("flags") or {}
    if not isinstance(flags, dict):
        raise BadRequest(f"{field.rpartition('.')[0] or 'flags'}.flags: an object is required")
    return patterns.compile(
        pattern,
        field,
        bool(config.get("ignore_case") or flags.get("case_insensitive")),
        bool(flags.get("multi_line")),
    )


def selectors_of(raw: Any) -> list[tuple[str, str, list[str]]]:
    """Both dialects of label_selectors as (key, op, values)."""
    out = []
    for i, s in enumerate(raw or []):
        if not isinstance(s, dict):
            raise BadRequest(f"label_selectors: {s!r}: an object is required")
        key = str(s.get("key") or s.get("type") or "")
        op = OPS.get(str(s.get("operator") or "=").lower())
        if op is None:
            raise BadRequest(
                f"label_selectors: operator {s.get('operator')!r}: one of "
                f"{', '.join(sorted(OPS))}"
            )
        values = s.get("values")
        if values is None:
            v = s.get("value", "")
            values = (
                [x.strip() for x in v.split(",")]
                if op in ("in", "notin") and isinstance(v, str)
                else [v]
            )
        values = [str(x) for x in values] if isinstance(values, list) else [str(values)]
        if op in ("regex", "notregex"):
            patterns.check(values[0] if values else "", f"label_selectors[{i}].value")
        out.append((key, op, values))
    return out


def rule_of(row: Any) -> Rule:
    """A stored rule, both dialects read; a rule whose pattern does not compile never
    matches (its error kept)."""
    cfg = row.match_config or {}
    th = cfg.get("threshold") or {}
    error, pattern = "", None
    try:
        if cfg.get("pattern"):
            pattern = compile_pattern(str(cfg["pattern"]), cfg)
        selectors = selectors_of(row.label_selectors)
        window = duration_seconds(th.get("time_window") or th.get("window") or 0)
    except BadRequest as exc:
        error, selectors, window = str(exc), [], 0
    return Rule(
        int(row.id),
        str(row.name),
        str(row.cluster_name),
        str(row.severity),
        str(row.match_type),
        pattern,
        int(th.get("count_threshold") or th.get("count") or 1),
        window,
        selectors,
        [str(g) for g in (row.group_by or ["workload"])],
        int(row.repeat_interval),
        dict(row.alert_template or {}),
        error,
        tuple(str(k).lower() for k in cfg.get("keywords") or () if k),
    )


def _holds(op: str, have: str, values: list[str]) -> bool:
    want = values[0] if values else ""
    if op == "eq":
        return have == want
    if op == "ne":
        return have != want
    if op == "in":
        return have in values
    if op == "notin":
        return have not in values
    if op == "exists":
        return bool(have)
    if op == "notexists":
        return not have
    return _full(want, have) == (op == "regex")


def _selected(rule: Rule, line: Line) -> bool:
    return all(_holds(op, line.field(key), values) for key, op, values in rule.selectors)


def _full(pattern: str, value: str) -> bool:
    return patterns.full(pattern, value)


def group_key(rule: Rule, line: Line) -> str:
    """What one alert of the rule is per: its group_by fields (a line without a workload
    falls back to its pod)."""
    parts = []
    for g in rule.group_by:
        v = line.field(g if g != "workload" else "workload_name")
        if g == "workload":
            v = line.workload_uid or f"pod:{line.namespace}/{line.pod}"
        parts.append(f"{g}={v}")
    return ",".join(parts)


def render(text: str, line: Line, rule: Rule) -> str:
    """A template's text with {{.PodName}}, {{.WorkloadName}}, {{.NodeName}},
    {{.Namespace}}, {{.ClusterName}}, {{.LogMessage}}, {{.RuleName}} filled in."""
    values = {
        "PodName": line.pod,
        "WorkloadName": line.workload_name or line.pod,
        "WorkloadID": line.workload_uid,
        "NodeName": line.node,
        "Namespace": line.namespace,
        "ClusterName": line.cluster,
        "LogMessage": line.text[:200],
        "RuleName": rule.name,
    }
    return re.sub(r"\{\{\s*\.(\w+)\s*\}\}", lambda m: values.get(m.group(1), m.group(0)), text)


@dataclass
class Counts:
    evaluated: int = 0
    matched: int = 0
    fired: int = 0
    suppressed: int = 0  # matched again within the rule's repeat_interval


class LogRules:
    """The leader's rules in memory (read again every reload seconds) and their state:
    each group's recent matches (threshold) and when it last fired (repeat)."""

    def __init__(self, engine: Engine, reload: float, clock: Callable[[], datetime]) -> None:
        self.db, self.reload, self.clock = engine, reload, clock
        self.rules: list[Rule] = []
        self._read: datetime | None = None
        self._lock = threading.Lock()
        self._windows: dict[tuple[int, str], deque[datetime]] = {}
        self._fired: dict[tuple[int, str], datetime] = {}
        self.counts = Counts()
        self.by_rule: dict[int, int] = {}  # fired per rule since start

    def _rules(self, now: datetime) -> list[Rule]:
        if self._read is None or (now - self._read).total_seconds() >= self.reload:
            r = t.log_alert_rules
            with self.db.connect() as conn:
                rows = conn.execute(
                    select(r).where(r.c.enabled.is_(True)).order_by(r.c.priority.desc(), r.c.id)
                )
                self.rules = [rule_of(x) for x in rows]
            self._read = now
        return self.rules

    def invalidate(self) -> None:
        """A rule changed: read them again at the next line."""
        with self._lock:
            self._read = None

    def evaluate(self, lines: list[Line]) -> list[AlertIn]:
        """The alerts these lines fire (each rule and group once per repeat_interval)."""
        now = self.clock()
        out: list[AlertIn] = []
        fired_rules: dict[int, datetime] = {}
        with self._lock:
            rules = self._rules(now)
            for line in lines:
                low: str | None = None  # the line in lower case, made once if a rule asks
                for rule in rules:
                    if rule.error or (
                        rule.cluster and line.cluster and rule.cluster != line.cluster
                    ):
                        continue
                    self.counts.evaluated += 1
                    if not _selected(rule, line):
                        continue
                    if rule.keywords:  # a cheap test first: most lines hold none of them
                        if low is None:
                            low = line.text.lower()
                        if not any(k in low for k in rule.keywords):
                            continue
                    if rule.pattern is not None and rule.pattern.search(line.text) is None:
                        continue
                    self.counts.matched += 1
                    key = group_key(rule, line)
                    if rule.match_type == "threshold":
                        w = self._windows.setdefault((rule.id, key), deque())
                        w.append(line.at)
                        while w and (line.at - w[0]).total_seconds() > rule.window:
                            w.popleft()
                        if len(w) < rule.count:
                            continue
                    last = self._fired.get((rule.id, key))
                    if last is not None and (line.at - last).total_seconds() < rule.repeat:
                        self.counts.suppressed += 1
                        continue
                    self._fired[(rule.id, key)] = line.at
                    self.counts.fired += 1
                    self.by_rule[rule.id] = self.by_rule.get(rule.id, 0) + 1
                    fired_rules[rule.id] = line.at
                    out.append(self._alert(rule, key, line))
            self._forget(now)
        if fired_rules:
            r = t.log_alert_rules
            with self.db.begin() as conn:
                for rid, at in fired_rules.items():
                    conn.execute(
                        update(r)
                        .where(r.c.id == rid)
                        .values(last_triggered_at=at, trigger_count=r.c.trigger_count + 1)
                    )
        return out

    def _forget(self, now: datetime) -> None:
        """Groups quiet for a day go (bounded memory)."""
        if len(self._fired) + len(self._windows) < 10_000:
            return
        day = timedelta(days=1)
        self._fired = {k: v for k, v in self._fired.items() if now - v < day}
        self._windows = {k: w for k, w in self._windows.items() if w and now - w[-1] < day}

    def _alert(self, rule: Rule, key: str, line: Line) -> AlertIn:
        tpl = rule.template
        labels = {
            "alertname": _alert_name(rule),
            "severity": model.severity(rule.severity),
            "source": "log",
            "rule_id": str(rule.id),
        }
        for k, v in (
            ("namespace", line.namespace),
            ("pod", line.pod),
            ("node", line.node),
            ("workload", line.workload_name),
            ("workload_uid", line.workload_uid),
            ("workload_kind", line.workload_kind),
            ("cluster", line.cluster),
        ):
            if v:
                labels[k] = v
        labels |= {str(k): str(v) for k, v in (tpl.get("labels") or {}).items()}
        notes = {
            "summary": render(str(tpl.get("summary") or tpl.get("title") or rule.name), line, rule),
            "description": render(str(tpl.get("description") or ""), line, rule),
            "log_message": line.text[:MESSAGE_MAX],
            "rule": rule.name,
        }
        notes |= {
            str(k): render(str(v), line, rule) for k, v in (tpl.get("annotations") or {}).items()
        }
        aid = hashlib.sha256(f"log\0{rule.id}\0{key}\0{line.at.isoformat()}".encode()).hexdigest()[
            :16
        ]
        return AlertIn(
            id=aid,
            source="log",
            alert_name=labels["alertname"],
            severity=labels["severity"],
            status="firing",
            starts_at=line.at,
            ends_at=None,
            labels=labels,
            annotations=notes,
            cluster=line.cluster,
            raw={
                "rule_id": rule.id,
                "rule_name": rule.name,
                "group": key,
                "log_time": line.at.isoformat(),
                "pod": line.pod,
                "namespace": line.namespace,
            },
            route_key=key,
        )


def _alert_name(rule: Rule) -> str:
    """The alert's name: the template's alertname label, else the rule's name."""
    return str((rule.template.get("labels") or {}).get("alertname") or rule.name)


def test_pattern(body: dict[str, Any]) -> dict[str, Any]:
    """POST log-alert-rules/test: {pattern, sample_log, flags} -> {matched, captures}."""
    pattern = str(body.get("pattern") or (body.get("match_config") or {}).get("pattern") or "")
    if not pattern:
        raise BadRequest("pattern is required")
    rx = compile_pattern(
        pattern, {"flags": body.get("flags") or {}, "ignore_case": body.get("ignore_case")}
    )
    sample = str(body.get("sample_log") or "\n".join(body.get("sample_logs") or []))
    m = rx.search(sample)
    return {
        "matched": m is not None,
        "captures": [g for g in m.groups() if g is not None] if m else [],
    }


RULE_FIELDS = (
    "name",
    "description",
    "cluster_name",
    "enabled",
    "priority",
    "label_selectors",
    "match_type",
    "match_config",
    "severity",
    "alert_template",
    "group_by",
    "group_wait",
    "repeat_interval",
)


def check_rule(body: dict[str, Any], partial: bool = False) -> dict[str, Any]:
    """The fields a rule's body sets, checked (partial: only those present)."""
    out: dict[str, Any] = {}
    if not partial or "name" in body:
        out["name"] = model.need_name(body)
    if not partial or "match_type" in body:
        mt = str(body.get("match_type") or "pattern")
        if mt not in MATCH_TYPES:
            raise BadRequest(f"match_type={mt!r}: one of {', '.join(MATCH_TYPES)}")
        out["match_type"] = mt
    if not partial or "match_config" in body:
        cfg = body.get("match_config") or {}
        if not isinstance(cfg, dict) or not cfg.get("pattern"):
            raise BadRequest("match_config.pattern is required")
        compile_pattern(str(cfg["pattern"]), cfg)
        kws = cfg.get("keywords") or []
        if not isinstance(kws, list) or not all(isinstance(k, str) and k for k in kws):
            raise BadRequest(
                "match_config.keywords: a list of words (a line must hold one, "
                "in any case, before the pattern is searched)"
            )
        th = cfg.get("threshold") or {}
        if th:
            duration_seconds(th.get("time_window") or th.get("window") or 0)
        out["match_config"] = cfg
    if not partial or "label_selectors" in body:
        selectors_of(body.get("label_selectors"))
        out["label_selectors"] = list(body.get("label_selectors") or [])
    if not partial or "group_by" in body:
        groups = body.get("group_by") or ["workload"]
        if not isinstance(groups, list) or any(g not in GROUPS for g in groups):
            raise BadRequest(f"group_by={groups!r}: a list of {', '.join(GROUPS)}")
        out["group_by"] = groups
    if not partial or "severity" in body:
        out["severity"] = model.severity(body.get("severity"))
    for key, default in (("priority", 50), ("group_wait", 30), ("repeat_interval", 3600)):
        if not partial or key in body:
            raw: Any = body.get(key)
            out[key] = inputs.whole(
                raw if raw not in (None, "") else default, key, -(1 << 31), (1 << 31) - 1
            )  # (their columns' Integer)
    if not partial or "alert_template" in body:
        out["alert_template"] = dict(body.get("alert_template") or {})
    for key in ("description", "cluster_name"):
        if not partial or key in body:
            out[key] = str(body.get(key) or "")
    if not partial or "enabled" in body:
        out["enabled"] = bool(body.get("enabled", True))
    return out


def create_rule(
    conn: Connection, body: dict[str, Any], now: datetime, who: str, template_id: int | None = None
) -> int:
    r = t.log_alert_rules
    fields = check_rule(body)
    taken = conn.execute(
        select(r.c.id).where(r.c.name == fields["name"], r.c.cluster_name == fields["cluster_name"])
    ).first()
    if taken is not None:
        raise Conflict(
            f"a log rule {fields['name']!r} exists in cluster "
            f"{fields['cluster_name'] or '(every cluster)'!r}"
        )
    return new_id(
        conn.execute(
            r.insert().values(
                **fields,
                template_id=template_id,
                created_by=who,
                trigger_count=0,
                created_at=now,
                updated_at=now,
            )
        )
    )
