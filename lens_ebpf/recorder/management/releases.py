"""The Release Management page: which lens-ebpf each cluster runs, read from its agent's
DaemonSet image (the leader's scan, recorder.management.release_scan_seconds: each
version seen becomes a release version, channel "observed"), the versions offered (made
on the page: an image registry and tag each), the version each cluster should run, the
default cluster, and deploy and rollback: the agent's objects installed with a version's
image, as a task (tasks.py) whose history the page lists."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, delete, select, update

from lens_ebpf.k8s.reflector import describe
from lens_ebpf.recorder.alerts.model import when
from lens_ebpf.recorder.errors import BadRequest, Conflict, Forbidden, NotFound
from lens_ebpf.recorder.lifecycle import parse_time
from lens_ebpf.recorder.management import manifest
from lens_ebpf.recorder.management.clusters import MC, TASKS, ensure_row
from lens_ebpf.recorder.management.tasks import ACTIVE, Tasks, history_json
from lens_ebpf.recorder.store import schema as t
from lens_ebpf.recorder.store.writer import Op, Writer
from lens_ebpf.recorder.tracker.clusters import Clusters

log = logging.getLogger(__name__)
RV = t.release_versions
CHANNELS = ("stable", "beta", "canary", "observed")
STATUSES = ("draft", "active", "deprecated")
VERSION_FIELDS = {
    "version_name": str,
    "channel": str,
    "chart_repo": str,
    "chart_version": str,
    "image_registry": str,
    "image_tag": str,
    "default_values": dict,
    "values_schema": dict,
    "release_notes": str,
}


def version_json(r: Any) -> dict[str, Any]:
    """ReleaseVersion."""
    return {
        "id": int(r.id),
        "version_name": r.version_name,
        "channel": r.channel,
        "chart_repo": r.chart_repo,
        "chart_version": r.chart_version,
        "image_registry": r.image_registry,
        "image_tag": r.image_tag,
        "default_values": r.default_values or {},
        "values_schema": r.values_schema or {},
        "status": r.status,
        "release_notes": r.release_notes,
        "created_by": "",
        "created_at": when(r.created_at),
        "updated_at": when(r.updated_at),
        "image": image_of(r),
    }


def image_of(r: Any) -> str:
    """The agent image a version installs: its registry (a repository, or where the
    lens-ebpf repository is) and tag."""
    reg = (r.image_registry or "").rstrip("/")
    if not reg:
        reg = manifest.split_image(manifest.agent_image())[0]
    elif not reg.rsplit("/", 1)[-1].startswith("lens-ebpf"):
        reg = f"{reg}/lens-ebpf"
    return f"{reg}:{r.image_tag}"


class Releases:
    """The versions, each cluster's, the leader's scan of what runs."""

    def __init__(
        self,
        engine: Any,
        writer: Writer,
        clusters: Clusters,
        tasks: Tasks,
        timeout: float,
        clock: Callable[[], datetime],
    ) -> None:
        self.engine, self.writer, self.clusters, self.tasks = engine, writer, clusters, tasks
        self.timeout, self.clock = timeout, clock
        self.scans: dict[str, int] = {"ok": 0, "error": 0}

    # -- the scan -----------------------------------------------------------------------------
    def scan(self) -> int:
        """Every cluster's agent DaemonSet read; what it runs stored (a version seen for the
        first time becomes an observed release version). The clusters read."""
        n = 0
        for w in self.clusters.all():
            n += self.scan_one(w.name)
        return n

    def scan_one(self, name: str) -> int:
        w = self.clusters.get(name)
        if w is None:
            return 0
        now = self.clock()
        seen: dict[str, Any] = {"scanned_at": when(now)}
        try:
            if w.client is None:
                raise RuntimeError(w.error or "no API client")
            found = manifest.daemonsets(manifest.RawApi(w.client, self.timeout))
        except Exception as exc:
            self.scans["error"] += 1
            seen["error"] = describe(exc)
            self.writer.submit(
                Op("managed_clusters", lambda conn: self._store(conn, name, seen, None, now))
            )
            return 0
        self.scans["ok"] += 1
        ds = sorted(
            found,
            key=lambda d: (
                d["metadata"].get("name") != "lens-ebpf",
                d["metadata"].get("namespace", ""),
            ),
        )
        if ds:
            d = ds[0]
            image = str(d["spec"]["template"]["spec"]["containers"][0].get("image", ""))
            st = d.get("status") or {}
            repo, tag = manifest.split_image(image)
            seen |= {
                "image": image,
                "version": tag,
                "repository": repo,
                "namespace": d["metadata"].get("namespace", ""),
                "name": d["metadata"].get("name", ""),
                "desired": int(st.get("desiredNumberScheduled") or 0),
                "ready": int(st.get("numberReady") or 0),
                "updated": int(st.get("updatedNumberScheduled") or 0),
                "created_at": d["metadata"].get("creationTimestamp", ""),
            }
        self.writer.submit(
            Op(
                "managed_clusters",
                lambda conn: self._store(conn, name, seen, seen.get("image"), now),
            )
        )
        return 1

    @staticmethod
    def _store(
        conn: Connection, name: str, seen: dict[str, Any], image: str | None, now: datetime
    ) -> None:
        row = ensure_row(conn, name, now)
        values: dict[str, Any] = {
            "deployed_values": {**(row.deployed_values or {}), "agent": seen},
            "updated_at": now,
        }
        if image:
            repo, tag = manifest.split_image(image)
            same = [
                r
                for r in conn.execute(select(RV).where(RV.c.image_tag == tag).order_by(RV.c.id))
                if image_of(r) == image
            ]
            vid = same[0].id if same else None
            if vid is None:
                name_taken = conn.execute(select(RV.c.id).where(RV.c.version_name == tag)).first()
                conn.execute(
                    RV.insert(),
                    {
                        "version_name": tag if name_taken is None else f"{tag} ({repo})",
                        "channel": "observed",
                        "chart_repo": "",
                        "chart_version": "",
                        "image_registry": repo,
                        "image_tag": tag,
                        "default_values": {},
                        "values_schema": {},
                        "status": "active",
                        "release_notes": f"seen running in cluster {name}",
                        "created_at": now,
                        "updated_at": now,
                    },
                )
                vid = conn.execute(
                    select(RV.c.id).where(RV.c.image_tag == tag, RV.c.image_registry == repo)
                ).scalar()
            values["deployed_version_id"] = vid
            if row.deployed_version_id != vid:
                made = parse_time(seen.get("created_at"))
                values["deployed_at"] = made or now
        else:
            values |= {"deployed_version_id": None} if "error" not in seen else {}
        conn.execute(update(MC).where(MC.c.cluster_name == name).values(**values))

    def scanned(self, conn: Connection, name: str) -> dict[str, Any]:
        """What the last scan found in the cluster ({} before the first)."""
        r = conn.execute(select(MC.c.deployed_values).where(MC.c.cluster_name == name)).first()
        got = (r.deployed_values or {}).get("agent") if r is not None else None
        return dict(got) if isinstance(got, dict) else {}

    # -- versions -----------------------------------------------------------------------------
    def versions(self, conn: Connection, channel: str, status: str) -> list[dict[str, Any]]:
        q = select(RV).order_by(RV.c.created_at.desc(), RV.c.id.desc())
        if channel:
            q = q.where(RV.c.channel == channel)
        if status:
            q = q.where(RV.c.status == status)
        return [version_json(r) for r in conn.execute(q)]

    def _version(self, conn: Connection, ident: int) -> Any:
        r = conn.execute(select(RV).where(RV.c.id == ident)).first()
        if r is None:
            raise NotFound(f"release version {ident} not found")
        return r

    def version(self, conn: Connection, ident: int) -> dict[str, Any]:
        return version_json(self._version(conn, ident))

    @staticmethod
    def _fields(body: dict[str, Any], partial: bool) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, kind in VERSION_FIELDS.items():
            if body.get(k) is None:
                continue
            if not isinstance(body[k], kind):
                raise BadRequest(
                    f"{k}: {'an object' if kind is dict else 'a string'} is " "required"
                )
            out[k] = body[k].strip() if isinstance(body[k], str) else body[k]
        if not partial:
            for k in ("version_name", "image_tag"):
                if not out.get(k):
                    raise BadRequest(f"{k} is required")
        tag = out.get("image_tag")
        if tag is not None and (not tag or any(c in tag for c in " /@:")):
            raise BadRequest(f"image_tag={tag!r}: an image tag (no spaces, /, : or @)")
        if out.get("channel") and out["channel"] not in CHANNELS:
            raise BadRequest(f"channel={out['channel']!r}: one of {', '.join(CHANNELS)}")
        return out

    def create_version(
        self, conn: Connection, body: dict[str, Any], now: datetime
    ) -> dict[str, Any]:
        fields = self._fields(body, partial=False)
        if conn.execute(select(RV.c.id).where(RV.c.version_name == fields["version_name"])).first():
            raise Conflict(f"release version {fields['version_name']!r} exists already")
        row = {
            "channel": "stable",
            "chart_repo": "",
            "chart_version": "",
            "image_registry": "",
            "default_values": {},
            "values_schema": {},
            "status": "draft",
            "release_notes": "",
            **fields,
            "created_at": now,
            "updated_at": now,
        }
        ident: int = conn.execute(RV.insert().returning(RV.c.id), row).scalar_one()
        return self.version(conn, int(ident))

    def update_version(
        self, conn: Connection, ident: int, body: dict[str, Any], now: datetime
    ) -> dict[str, Any]:
        self._version(conn, ident)
        fields = self._fields(body, partial=True)
        if (
            fields.get("version_name")
            and conn.execute(
                select(RV.c.id).where(RV.c.version_name == fields["version_name"], RV.c.id != ident)
            ).first()
        ):
            raise Conflict(f"release version {fields['version_name']!r} exists already")
        conn.execute(update(RV).where(RV.c.id == ident).values(updated_at=now, **fields))
        return self.version(conn, ident)

    def set_status(
        self, conn: Connection, ident: int, status: str, now: datetime
    ) -> dict[str, Any]:
        if status not in STATUSES:
            raise BadRequest(f"status={status!r}: one of {', '.join(STATUSES)}")
        self._version(conn, ident)
        conn.execute(update(RV).where(RV.c.id == ident).values(status=status, updated_at=now))
        return {"status": "updated"}

    def delete_version(self, conn: Connection, ident: int) -> dict[str, Any]:
        self._version(conn, ident)
        used = conn.execute(
            select(MC.c.cluster_name).where(
                (MC.c.release_version_id == ident) | (MC.c.deployed_version_id == ident)
            )
        ).first()
        if used is not None:
            raise Forbidden(f"release version {ident} is cluster {used.cluster_name}'s")
        conn.execute(delete(RV).where(RV.c.id == ident))
        return {"status": "deleted"}

    # -- each cluster's -----------------------------------------------------------------------
    def config_json(
        self, conn: Connection, r: Any, versions: dict[int, dict[str, Any]]
    ) -> dict[str, Any]:
        """ClusterReleaseConfig: the version it should run, the one it runs, in sync or not."""
        task = conn.execute(
            select(TASKS)
            .where(TASKS.c.cluster_name == r.cluster_name)
            .order_by(TASKS.c.id.desc())
            .limit(1)
        ).first()
        agent = (r.deployed_values or {}).get("agent") or {}
        want, have = r.release_version_id, r.deployed_version_id
        if task is not None and task.status in ACTIVE:
            sync = "upgrading"
        elif task is not None and task.status == "failed" and task.action != "initialize":
            sync = "failed"
        elif have is None:
            sync = "not_installed" if not agent.get("error") else "unknown"
        elif want is None or want == have:
            sync = "synced"
        else:
            sync = "out_of_sync"
        out: dict[str, Any] = {
            "id": 0,
            "cluster_name": r.cluster_name,
            "release_version_id": int(want) if want is not None else None,
            "values_override": r.values_override or {},
            "deployed_version_id": int(have) if have is not None else None,
            "deployed_values": r.deployed_values or {},
            "deployed_at": when(r.deployed_at),
            "sync_status": sync,
            "last_sync_at": agent.get("scanned_at"),
            "last_sync_error": agent.get("error", ""),
            "auto_upgrade": False,
            "upgrade_channel": "stable",
            "created_at": when(r.created_at),
            "updated_at": when(r.updated_at),
            "agent_image": agent.get("image", ""),
            "is_default": bool(r.is_default),
        }
        if want is not None and int(want) in versions:
            out["release_version"] = versions[int(want)]
        if have is not None and int(have) in versions:
            out["deployed_version"] = versions[int(have)]
        return out

    def _versions(self, conn: Connection) -> dict[int, dict[str, Any]]:
        return {int(r.id): version_json(r) for r in conn.execute(select(RV))}

    def configs(self, conn: Connection) -> list[dict[str, Any]]:
        """Every followed cluster's (a row made for each when it has none yet)."""
        now = self.clock()
        versions = self._versions(conn)
        names = sorted(self.clusters.names(), key=lambda n: (n != self.clusters.home_name, n))
        rows = {r.cluster_name: r for r in conn.execute(select(MC))}
        out = []
        for i, name in enumerate(names):
            r = rows.get(name) or _blank(name, now)
            item = self.config_json(conn, r, versions)
            item["id"] = i + 1
            out.append(item)
        return out

    def config(self, conn: Connection, name: str) -> dict[str, Any]:
        for item in self.configs(conn):
            if item["cluster_name"] == name:
                return item
        raise NotFound(f"cluster config not found: {name!r}")

    def set_version(
        self, conn: Connection, name: str, body: dict[str, Any], now: datetime
    ) -> dict[str, Any]:
        """{release_version_id, values_override}: the version the cluster should run."""
        if self.clusters.get(name) is None:
            raise NotFound(f"cluster config not found: {name!r}")
        vid = body.get("release_version_id")
        if not isinstance(vid, int) or isinstance(vid, bool):
            raise BadRequest("release_version_id: a release version's id is required")
        self._version(conn, vid)
        values = body.get("values_override") or {}
        if not isinstance(values, dict):
            raise BadRequest("values_override: an object is required")
        ensure_row(conn, name, now)
        conn.execute(
            update(MC)
            .where(MC.c.cluster_name == name)
            .values(release_version_id=vid, values_override=values, updated_at=now)
        )
        return {"status": "updated"}

    def set_values(
        self, conn: Connection, name: str, body: dict[str, Any], now: datetime
    ) -> dict[str, Any]:
        if self.clusters.get(name) is None:
            raise NotFound(f"cluster config not found: {name!r}")
        values = body.get("values_override", body)
        if not isinstance(values, dict):
            raise BadRequest("values_override: an object is required")
        ensure_row(conn, name, now)
        conn.execute(
            update(MC)
            .where(MC.c.cluster_name == name)
            .values(values_override=values, updated_at=now)
        )
        return self.config(conn, name)

    def deploy(
        self, conn: Connection, name: str, body: dict[str, Any], now: datetime, who: str
    ) -> dict[str, Any]:
        """The cluster's version installed (its agent objects with that image): a task."""
        cfg = self.config(conn, name)
        vid = cfg["release_version_id"]
        if vid is None:
            raise BadRequest(
                "no version configured for cluster: set one first (PUT "
                f"releases/clusters/{name}/version)"
            )
        v = self._version(conn, vid)
        action = str(body.get("action") or "")
        if not action:
            have = cfg["deployed_version_id"]
            action = "install" if have is None else ("upgrade" if have != vid else "sync")
        values = {
            "image": image_of(v),
            **(v.default_values or {}),
            **cfg["values_override"],
            "previous_version_id": cfg["deployed_version_id"],
        }
        got = self.tasks.create(conn, name, "apps", action, now, who, image_of(v), vid, values)
        return {
            "message": "deployment triggered",
            "history_id": got["task_id"],
            "task_id": got["task_id"],
        }

    def rollback(self, conn: Connection, name: str, now: datetime, who: str) -> dict[str, Any]:
        """The version of the last deploy that completed before the current one, again."""
        if self.clusters.get(name) is None:
            raise NotFound(f"cluster config not found: {name!r}")
        done = list(
            conn.execute(
                select(TASKS.c.release_version_id, TASKS.c.values_snapshot)
                .where(
                    TASKS.c.cluster_name == name,
                    TASKS.c.status == "completed",
                    TASKS.c.release_version_id.is_not(None),
                )
                .order_by(TASKS.c.id.desc())
            )
        )
        current = done[0].release_version_id if done else None
        before = (done[0].values_snapshot or {}).get("previous_version_id") if done else None
        back = (
            before
            if before is not None and before != current
            else next((r.release_version_id for r in done if r.release_version_id != current), None)
        )
        if back is None:
            raise NotFound("no successful deployment to rollback to")
        v = self._version(conn, int(back))
        got = self.tasks.create(
            conn,
            name,
            "apps",
            "rollback",
            now,
            who,
            image_of(v),
            int(back),
            {"image": image_of(v), "previous_version_id": current},
        )
        ensure_row(conn, name, now)
        conn.execute(
            update(MC)
            .where(MC.c.cluster_name == name)
            .values(release_version_id=int(back), updated_at=now)
        )
        return {
            "message": "rollback triggered",
            "history_id": got["task_id"],
            "rollback_to_version": int(back),
        }

    def history(self, conn: Connection, name: str, limit: int) -> list[dict[str, Any]]:
        versions = self._versions(conn)
        q = select(TASKS).where(TASKS.c.cluster_name == name).order_by(TASKS.c.id.desc())
        return [history_json(r, versions) for r in conn.execute(q.limit(limit))]

    def history_one(self, conn: Connection, ident: int) -> dict[str, Any]:
        r = conn.execute(select(TASKS).where(TASKS.c.id == ident)).first()
        if r is None:
            raise NotFound(f"release history {ident} not found")
        return history_json(r, self._versions(conn))


def _blank(name: str, now: datetime) -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(
        cluster_name=name,
        release_version_id=None,
        values_override={},
        deployed_version_id=None,
        deployed_values={},
        deployed_at=None,
        is_default=False,
        created_at=now,
        updated_at=now,
    )
