"""The shipped log rule templates (TEMPLATES, read from log_templates.yaml beside this
module): what breaks GPU training (NCCL/RCCL watchdog timeouts and aborts, CUDA and HIP
out of memory, Xid and ECC lines, NaN or inf loss, segmentation faults in collectives)
and a few general ones. On a first start each is stored as a template, and the GPU
training ones as enabled rules (seed); a rule is made from a template with instantiate.
"""

from __future__ import annotations

from datetime import datetime
from importlib import resources
from typing import Any

import yaml
from sqlalchemy import Connection, func, select, update

from lens_ebpf.recorder.alerts.logrules import RULE_FIELDS, create_rule
from lens_ebpf.recorder.alerts.model import new_id
from lens_ebpf.recorder.errors import NotFound
from lens_ebpf.recorder.store import schema as t


def _tpl(
    name: str,
    category: str,
    description: str,
    pattern: str,
    severity: str,
    summary: str,
    alertname: str,
    ignore_case: bool = True,
    training: bool = True,
    threshold: tuple[int, int] | None = None,
    keywords: tuple[str, ...] = (),
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "pattern": pattern,
        "ignore_case": ignore_case,
        "keywords": list(keywords),
    }
    if threshold:
        config["threshold"] = {"count_threshold": threshold[0], "time_window": threshold[1]}
    return {
        "name": name,
        "category": category,
        "description": description,
        "tags": [category, "gpu-training"] if training else [category],
        "training": training,
        "template_config": {
            "match_type": "threshold" if threshold else "pattern",
            "match_config": config,
            "label_selectors": [],
            "severity": severity,
            "group_by": ["workload"],
            "repeat_interval": 3600,
            "alert_template": {
                "summary": summary,
                "description": f"{description}: {{{{.Namespace}}}}/{{{{.PodName}}}} on "
                "{{.NodeName}} ({{.WorkloadName}}): {{.LogMessage}}",
                "labels": {"alertname": alertname, "category": category},
            },
        },
    }


def _templates() -> list[dict[str, Any]]:
    """log_templates.yaml, packaged beside this module, each entry made a template."""
    text = resources.files("lens_ebpf.recorder.alerts").joinpath("log_templates.yaml")
    out = []
    for entry in yaml.safe_load(text.read_text()):
        pattern, threshold = entry.pop("pattern"), entry.pop("threshold", None)
        out.append(
            _tpl(
                pattern="".join(pattern) if isinstance(pattern, list) else pattern,
                threshold=(threshold["count"], threshold["window_seconds"]) if threshold else None,
                keywords=tuple(entry.pop("keywords", ())),
                **entry,
            )
        )
    return out


TEMPLATES = _templates()


def seed(conn: Connection, now: datetime, cluster: str, rules: bool) -> int:
    """On a first start (no built-in template stored yet): the templates stored and, with
    rules, the GPU training ones as enabled rules of cluster ("": every cluster); the
    rules made."""
    tp = t.log_alert_rule_templates
    if conn.execute(
        select(func.count()).select_from(tp).where(tp.c.is_builtin.is_(True))
    ).scalar_one():
        return 0
    made = 0
    for tpl in TEMPLATES:
        tid = new_id(
            conn.execute(
                tp.insert().values(
                    name=tpl["name"],
                    category=tpl["category"],
                    description=tpl["description"],
                    template_config=tpl["template_config"],
                    tags=tpl["tags"],
                    is_builtin=True,
                    usage_count=0,
                    created_by="lens-ebpf",
                    created_at=now,
                    updated_at=now,
                )
            )
        )
        if rules and tpl["training"]:
            instantiate(
                conn, int(tid), {"name": tpl["name"], "cluster_name": cluster}, now, "lens-ebpf"
            )
            made += 1
    return made


def instantiate(
    conn: Connection, template_id: int, body: dict[str, Any], now: datetime, who: str
) -> dict[str, Any]:
    """A rule from a template (body: name, cluster_name, and any rule field to change)."""
    tp = t.log_alert_rule_templates
    row = conn.execute(select(tp).where(tp.c.id == template_id)).first()
    if row is None:
        raise NotFound(f"no template {template_id}")
    cfg = dict(row.template_config or {})
    fields = {
        **cfg,
        **(body.get("overrides") or {}),
        **{k: v for k, v in body.items() if k in RULE_FIELDS},
    }
    fields.setdefault("name", row.name)
    fields.setdefault("description", row.description)
    rid = create_rule(conn, fields, now, who, template_id)
    conn.execute(update(tp).where(tp.c.id == template_id).values(usage_count=tp.c.usage_count + 1))
    return {"rule_id": rid, "cluster_name": fields.get("cluster_name") or ""}
