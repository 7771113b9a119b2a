"""Metric alert rules: Prometheus rule groups kept here and written where Prometheus reads
them. `sync` makes each enabled rule a PrometheusRule object (monitoring.coreos.com/v1,
where the Prometheus Operator's CRD is installed) in recorder.alerts.rules_namespace,
labelled for the operator's ruleSelector (recorder.alerts.rule_labels), and removes those
of disabled or deleted rules; without the CRD, every enabled rule goes into one rules
file (recorder.alerts.rules_file, and GET metric-alert-rules/rules-file) that Prometheus
loads (rule_files). The rules deploy/prometheus-operator/prometheusrule.yaml ships are listed
too, as such (built_in: read only, cloned to change).

A rule is checked before it is stored as Prometheus checks a rules file (rulefmt): its
expr parsed as PromQL (promql-parser, a port of Prometheus's own parser), `for`,
`keep_firing_for` and a group's `interval` as Prometheus's durations, label and
annotation names, templates' actions closed, group names not repeated; 400 naming the
field with the parser's message. A rule stored before these checks that fails them is
left out of the rules file (one bad rule would make Prometheus refuse the whole file)."""

from __future__ import annotations

import re
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any

import promql_parser
import yaml
from sqlalchemy import Connection, delete, func, or_, select, update

from lens_ebpf.recorder.alerts.model import clone_target, need_name, new_id, paged
from lens_ebpf.recorder.errors import BadRequest, Conflict, Forbidden, NotFound
from lens_ebpf.recorder.store import schema as t

GROUP = ("monitoring.coreos.com", "v1", "prometheusrules")
MANAGED = "app.kubernetes.io/managed-by"
RULE_ID = "lens-ebpf.io/rule-id"
# the built-in rules' file in the repository (the copy packaged here: shipped())
SHIPPED = "deploy/prometheus-operator/prometheusrule.yaml"


def shipped() -> list[dict[str, Any]]:
    """The rule groups of SHIPPED (packaged beside this module)."""
    text = resources.files("lens_ebpf.recorder.alerts").joinpath("prometheusrule.yaml")
    doc = yaml.safe_load(text.read_text())
    return list(doc["spec"]["groups"])


def seed(conn: Connection, now: datetime, cluster: str) -> int:
    """The shipped groups as built-in rules of cluster, once (each by its group's name)."""
    r = t.metric_alert_rules
    made = 0
    for g in shipped():
        if conn.execute(
            select(r.c.id).where(r.c.name == g["name"], r.c.cluster_name == cluster)
        ).first():
            continue
        conn.execute(
            r.insert().values(
                name=g["name"],
                cluster_name=cluster,
                enabled=True,
                groups=[g],
                description=f"shipped in {SHIPPED}",
                labels={},
                built_in=True,
                sync_status="synced",
                sync_message=f"shipped in {SHIPPED}",
                last_sync_at=None,
                alert_routing=None,
                created_by="lens-ebpf",
                created_at=now,
                updated_at=now,
            )
        )
        made += 1
    return made


# Prometheus's durations (prometheus/common model.ParseDuration): units largest first, "0"
DURATION = re.compile(
    r"(?:([0-9]+)y)?(?:([0-9]+)w)?(?:([0-9]+)d)?(?:([0-9]+)h)?"
    r"(?:([0-9]+)m)?(?:([0-9]+)s)?(?:([0-9]+)ms)?"
)
DURATION_MS = (365 * 86400_000, 7 * 86400_000, 86400_000, 3600_000, 60_000, 1000, 1)
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")  # model.LabelName.IsValid (legacy names)


def duration(raw: Any, field: str) -> str:
    """A Prometheus duration ("5m", "1h30m", "0"); BadRequest naming field with
    Prometheus's message."""
    text = str(raw) if isinstance(raw, str | int) and not isinstance(raw, bool) else None
    if text == "0":
        return text
    m = DURATION.fullmatch(text or "")
    if text is None or not text or m is None:
        raise BadRequest(f'{field}: not a valid duration string: "{str(raw)[:40]}"')
    ms = sum(int(n) * unit for n, unit in zip(m.groups(), DURATION_MS, strict=True) if n)
    if ms > (1 << 63) // 1_000_000:  # past a Go time.Duration's nanoseconds
        raise BadRequest(f"{field}: duration out of range")
    return text


def expression(raw: Any, field: str) -> str:
    """PromQL that parses; BadRequest naming field with the parser's message."""
    text = str(raw)
    try:
        promql_parser.parse(text)
    except (ValueError, RuntimeError) as exc:  # (the parser's errors are ValueErrors)
        raise BadRequest(f"{field}: could not parse expression: {exc}") from None
    return text


def _texts(raw: Any, field: str, what: str) -> dict[str, str]:
    """A rule's labels or annotations: valid names, string values, templates whose
    actions close."""
    if raw in (None, {}):
        return {}
    if not isinstance(raw, dict):
        raise BadRequest(f"{field}: an object is required")
    out = {}
    for k, v in raw.items():
        if not LABEL_NAME.fullmatch(str(k)) or (what == "label" and k == "__name__"):
            raise BadRequest(f"{field}: invalid {what} name: {str(k)[:60]}")
        if not isinstance(v, str | int | float) or isinstance(v, bool):
            raise BadRequest(f"{field}.{k}: a string is required")
        text = str(v)
        at = text.find("{{")
        while at >= 0:  # (Go's text/template: an action is closed before the next opens)
            end = text.find("}}", at + 2)
            if end < 0 or "{{" in text[at + 2 : end]:
                raise BadRequest(f"{field}.{k}: template: unclosed action")
            at = text.find("{{", end + 2)
        out[str(k)] = text
    return out


def _check_groups(groups: Any) -> list[dict[str, Any]]:
    if not isinstance(groups, list) or not groups:
        raise BadRequest("groups: at least one rule group is required")
    out = []
    names: set[str] = set()
    for i, g in enumerate(groups):
        where = f"groups[{i}]"
        if (
            not isinstance(g, dict)
            or not g.get("name")
            or not isinstance(g.get("rules"), list)
            or not g["rules"]
        ):
            raise BadRequest(f"{where}: {str(g)[:100]}: name and rules are required")
        if str(g["name"]) in names:
            raise BadRequest(
                f"{where}.name: groupname: \"{str(g['name'])[:60]}\" is repeated "
                "in the same file"
            )
        names.add(str(g["name"]))
        rules = []
        for j, rule in enumerate(g["rules"]):
            at = f"{where}.rules[{j}]"
            if not isinstance(rule, dict) or not rule.get("alert") or not rule.get("expr"):
                raise BadRequest(f"{at}: {str(rule)[:100]}: alert and expr are required")
            keep: dict[str, Any] = {
                "alert": str(rule["alert"]),
                "expr": expression(rule["expr"], f"{at}.expr"),
            }
            for key in ("for", "keep_firing_for"):
                if rule.get(key) not in (None, ""):
                    keep[key] = duration(rule[key], f"{at}.{key}")
            for key, what in (("labels", "label"), ("annotations", "annotation")):
                texts = _texts(rule.get(key), f"{at}.{key}", what)
                if texts:
                    keep[key] = texts
            rules.append(keep)
        one = {"name": str(g["name"]), "rules": rules}
        if g.get("interval"):
            one["interval"] = duration(g["interval"], f"{where}.interval")
        out.append(one)
    return out


def valid(groups: Any) -> str:
    """Why stored groups would make Prometheus refuse a rules file ("" for none)."""
    try:
        _check_groups(groups)
    except BadRequest as exc:
        return str(exc)
    return ""


def _fields(body: dict[str, Any], partial: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if not partial or "name" in body:
        out["name"] = need_name(body)
    if not partial or "groups" in body:
        out["groups"] = _check_groups(body.get("groups"))
    if not partial or "labels" in body:
        out["labels"] = {str(k): str(v) for k, v in (body.get("labels") or {}).items()}
    for key in ("description",):
        if not partial or key in body:
            out[key] = str(body.get(key) or "")
    if not partial or "enabled" in body:
        out["enabled"] = bool(body.get("enabled", True))
    if "alert_routing" in body:
        out["alert_routing"] = body.get("alert_routing")
    return out


class MetricRules:
    def __init__(
        self,
        api_client: Any,
        namespace: str,
        rule_labels: dict[str, str],
        rules_file: str,
        home: str,
    ) -> None:
        self.client, self.namespace, self.home = api_client, namespace, home
        self.rule_labels, self.rules_file = dict(rule_labels), rules_file

    # -- the table -------------------------------------------------------------------------
    def page(
        self,
        conn: Connection,
        cluster: str,
        enabled: bool | None,
        status: str,
        search: str,
        offset: int,
        limit: int,
    ) -> dict[str, Any]:
        r = t.metric_alert_rules
        cond: list[Any] = []
        if cluster:
            cond.append(r.c.cluster_name == cluster)
        if enabled is not None:
            cond.append(r.c.enabled.is_(enabled))
        if status:
            cond.append(r.c.sync_status == status)
        if search:
            like = f"%{search.lower()}%"
            cond.append(
                or_(func.lower(r.c.name).like(like), func.lower(r.c.description).like(like))
            )
        order = (r.c.built_in, r.c.created_at.desc(), r.c.id)
        return paged(conn, r, cond, order, offset, limit)

    def get(self, conn: Connection, rid: int) -> Any:
        r = t.metric_alert_rules
        row = conn.execute(select(r).where(r.c.id == rid)).first()
        if row is None:
            raise NotFound(f"no metric alert rule {rid}")
        return row

    def create(
        self, conn: Connection, body: dict[str, Any], now: datetime, who: str
    ) -> dict[str, Any]:
        r = t.metric_alert_rules
        fields = _fields(body, partial=False)
        cluster = str(body.get("cluster_name") or body.get("cluster") or self.home)
        self._free(conn, fields["name"], cluster)
        rid = new_id(
            conn.execute(
                r.insert().values(
                    **fields,
                    cluster_name=cluster,
                    built_in=False,
                    sync_status="pending",
                    sync_message="",
                    created_by=who,
                    created_at=now,
                    updated_at=now,
                )
            )
        )
        return {"rule_id": rid, "message": "metric alert rule created successfully"}

    def _free(self, conn: Connection, name: str, cluster: str) -> None:
        r = t.metric_alert_rules
        if conn.execute(
            select(r.c.id).where(r.c.name == name, r.c.cluster_name == cluster)
        ).first():
            raise Conflict(f"a metric alert rule {name!r} exists in cluster {cluster!r}")

    def update(
        self, conn: Connection, rid: int, body: dict[str, Any], now: datetime
    ) -> dict[str, Any]:
        r = t.metric_alert_rules
        old = self.get(conn, rid)
        if old.built_in:
            raise Forbidden(f"rule {old.name!r} is shipped in {SHIPPED}: " "clone it to change it")
        fields = _fields(body, partial=True)
        if "name" in fields and fields["name"] != old.name:
            self._free(conn, fields["name"], old.cluster_name)
        conn.execute(
            update(r).where(r.c.id == rid).values(**fields, sync_status="pending", updated_at=now)
        )
        return {"rule_id": rid, "message": "metric alert rule updated successfully"}

    def delete(self, conn: Connection, rid: int) -> dict[str, Any]:
        r = t.metric_alert_rules
        old = self.get(conn, rid)
        if old.built_in:
            raise Forbidden(f"rule {old.name!r} is shipped in {SHIPPED}")
        conn.execute(delete(r).where(r.c.id == rid))
        warning = self._remove_object(rid)
        return {"message": "metric alert rule deleted successfully", "warning": warning}

    def clone(
        self, conn: Connection, rid: int, body: dict[str, Any], now: datetime, who: str
    ) -> dict[str, Any]:
        r = t.metric_alert_rules
        old = self.get(conn, rid)
        name, cluster = clone_target(conn, r, old, body, "-")
        self._free(conn, name, cluster)
        new = new_id(
            conn.execute(
                r.insert().values(
                    name=name,
                    cluster_name=cluster,
                    enabled=old.enabled,
                    groups=old.groups,
                    description=f"Cloned from {old.name} in cluster {old.cluster_name}",
                    labels=old.labels or {},
                    built_in=False,
                    sync_status="pending",
                    sync_message="",
                    alert_routing=old.alert_routing,
                    created_by=who,
                    created_at=now,
                    updated_at=now,
                )
            )
        )
        return {"rule_id": new, "message": "metric alert rule cloned successfully"}

    # -- where Prometheus reads them -------------------------------------------------------
    def _custom(self) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self.client)

    def _has_crd(self) -> bool:
        """Whether the API serves PrometheusRules (the operator's CRD is installed)."""
        if self.client is None:
            return False
        from lens_ebpf.k8s.reflector import call_raw

        try:
            doc = call_raw(self._custom().get_api_resources, GROUP[0], GROUP[1], timeout=10)
        except Exception as exc:
            if getattr(exc, "status", None) == 404:
                return False
            raise
        return any(x.get("name") == GROUP[2] for x in doc.get("resources") or ())

    @staticmethod
    def object_name(row: Any) -> str:
        slug = re.sub(r"[^a-z0-9-]+", "-", str(row.name).lower()).strip("-")[:40] or "rule"
        return f"lens-{slug}-{row.id}"

    def body(self, row: Any) -> dict[str, Any]:
        """The PrometheusRule a rule is written as."""
        labels = {
            **(row.labels or {}),
            **self.rule_labels,
            MANAGED: "lens-ebpf",
            RULE_ID: str(row.id),
        }
        return {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": {
                "name": self.object_name(row),
                "namespace": self.namespace,
                "labels": labels,
                "annotations": {"lens-ebpf.io/description": row.description or ""},
            },
            "spec": {"groups": list(row.groups or [])},
        }

    def rules_text(self, conn: Connection) -> str:
        """Every enabled rule's groups as one Prometheus rules file (group names made
        unique by the rule's id); a stored rule Prometheus would refuse left out."""
        return self._rules_file(conn)[0]

    def _rules_file(self, conn: Connection) -> tuple[str, dict[int, str]]:
        """The rules file, and why each rule left out of it was (by id)."""
        r = t.metric_alert_rules
        groups, left_out = [], {}
        for row in conn.execute(
            select(r).where(r.c.enabled.is_(True), r.c.built_in.is_(False)).order_by(r.c.id)
        ):
            why = valid(row.groups)
            if why:
                left_out[int(row.id)] = why
                continue
            for g in row.groups or []:
                groups.append({**g, "name": f"{g['name']} (rule {row.id})"})
        return yaml.safe_dump({"groups": groups}, sort_keys=False), left_out

    def sync(self, conn: Connection, ids: list[int], cluster: str, now: datetime) -> dict[str, Any]:
        """The rules asked for (ids; else every rule of cluster; else every rule) written
        where Prometheus reads them; each row's sync state set."""
        r = t.metric_alert_rules
        cond: list[Any] = [r.c.built_in.is_(False)]
        if ids:
            cond.append(r.c.id.in_(ids))
        elif cluster:
            cond.append(r.c.cluster_name == cluster)
        rows = list(conn.execute(select(r).where(*cond).order_by(r.c.id)))
        ok, failed, how = 0, 0, ""
        try:
            crd = self._has_crd()
        except Exception as exc:
            crd, how = False, f"the Kubernetes API could not be asked ({type(exc).__name__})"
        if not crd:
            text, left_out = self._rules_file(conn)
            where = "served at GET /v1/metric-alert-rules/rules-file"
            try:
                if self.rules_file:
                    Path(self.rules_file).write_text(text)
                    where = f"written to {self.rules_file} and {where}"
                status, message = "synced", f"no PrometheusRule CRD: {where}"
            except OSError as exc:
                status, message = "failed", f"rules file {self.rules_file}: {exc}"
            if how:
                message = f"{how}; {message}"
            for row in rows:
                said = left_out.get(int(row.id))
                good = status == "synced" and not said
                ok, failed = ok + good, failed + (not good)
                conn.execute(
                    update(r)
                    .where(r.c.id == row.id)
                    .values(
                        sync_status="failed" if said else status,
                        sync_message=f"left out of the rules file: {said}" if said else message,
                        last_sync_at=now,
                    )
                )
            return {
                "total": len(rows),
                "synced": ok,
                "success": ok,
                "failed": failed,
                "message": message,
            }
        for row in rows:
            try:
                why = valid(row.groups) if row.enabled else ""
                if why:  # (Prometheus would refuse it: not written)
                    raise BadRequest(why)
                if row.enabled:
                    self._apply(row)
                    message = f"PrometheusRule {self.namespace}/{self.object_name(row)}"
                else:
                    self._remove_object(row.id)
                    message = "disabled: its PrometheusRule removed"
                status = "synced"
                ok += 1
            except Exception as exc:
                status, message = "failed", f"{type(exc).__name__}: {exc}"[:300]
                failed += 1
            conn.execute(
                update(r)
                .where(r.c.id == row.id)
                .values(sync_status=status, sync_message=message, last_sync_at=now)
            )
        return {
            "total": len(rows),
            "synced": ok,
            "success": ok,
            "failed": failed,
            "message": f"synced {ok} rules successfully, {failed} failed",
        }

    def _apply(self, row: Any) -> None:
        from lens_ebpf.k8s.reflector import call_raw

        api, body = self._custom(), self.body(row)
        g, v, plural = GROUP
        try:
            old = call_raw(
                api.get_namespaced_custom_object,
                g,
                v,
                self.namespace,
                plural,
                body["metadata"]["name"],
                timeout=10,
            )
        except Exception as exc:
            if getattr(exc, "status", None) != 404:
                raise
            call_raw(
                api.create_namespaced_custom_object, g, v, self.namespace, plural, body, timeout=10
            )
            return
        body["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        call_raw(
            api.replace_namespaced_custom_object,
            g,
            v,
            self.namespace,
            plural,
            body["metadata"]["name"],
            body,
            timeout=10,
        )

    def _remove_object(self, rid: int) -> str:
        """The PrometheusRule of rule rid deleted, if there is one; a warning, or ""."""
        if self.client is None:
            return ""
        from lens_ebpf.k8s.reflector import call_raw

        g, v, plural = GROUP
        try:
            listed = call_raw(
                self._custom().list_namespaced_custom_object,
                g,
                v,
                self.namespace,
                plural,
                label_selector=f"{RULE_ID}={rid}",
                timeout=10,
            )
            for item in listed.get("items") or ():
                call_raw(
                    self._custom().delete_namespaced_custom_object,
                    g,
                    v,
                    self.namespace,
                    plural,
                    item["metadata"]["name"],
                    timeout=10,
                )
        except Exception as exc:
            if getattr(exc, "status", None) == 404:
                return ""
            return f"its PrometheusRule could not be removed: {type(exc).__name__}"
        return ""
