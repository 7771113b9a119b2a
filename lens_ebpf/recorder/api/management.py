"""The Cluster Management page's routes (management/clusters, management/config), answered
as the original answers them: the data itself, no envelope (the page reads the list as
the body), a status of its own (201 made, 204 removed); an error is the envelope with
the original's {"error": ...} beside it (the page shows that). Writes need the API's
credentials, as every write does (envelope.py's LensApi checks them)."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson

from lens_ebpf.core.routes import Answer, Param, Request, Route, RouteTable, Surface
from lens_ebpf.recorder import inputs
from lens_ebpf.recorder.api.envelope import JSON_OPTIONS, Ask, answer, bad, integer, param
from lens_ebpf.recorder.errors import Unavailable
from lens_ebpf.recorder.management import tasks
from lens_ebpf.recorder.management.hub import Management
from lens_ebpf.recorder.management.settings import INSTALLER, RUNTIME

routes = RouteTable()
CLUSTERS = "management/clusters"
ONE = f"{CLUSTERS}/{{cluster_name}}"
LIMIT_MAX = 1000
SCOPE = Param("scope", choices=("infrastructure", "apps", "full"))


@dataclasses.dataclass(frozen=True)
class Status:
    """An answer with a status of its own (201: made; 204: removed, no body)."""

    code: int
    body: Any = None


def hub(ask: Ask) -> Management:
    got: Management | None = getattr(ask.app, "management", None)
    if got is None:
        raise Unavailable("cluster management is not set up in this service")
    return got


def who(ask: Ask) -> str:
    return ask.req.user or "api"


# -- clusters -----------------------------------------------------------------------------------
@routes.get(CLUSTERS)
def clusters(ask: Ask) -> Any:
    """Every cluster the service follows, as ClusterConfigResponse (a list)."""
    return hub(ask).admin.listing(ask.conn)


@routes.post(CLUSTERS)
def cluster_add(ask: Ask) -> Any:
    """{cluster_name, display_name, description, labels, and kubeconfig (its text) or
    k8s_endpoint with k8s_ca_data and k8s_token or k8s_cert_data + k8s_key_data}: checked
    (a client, an API that answers), kept in the multi-cluster Secret, followed at once;
    201 with the cluster."""
    return Status(201, hub(ask).admin.add(ask.conn, ask.body(), ask.now(), who(ask)))


@routes.get(ONE)
def cluster(ask: Ask) -> Any:
    """One cluster as ClusterConfigResponse (no secret: its kubeconfig stays in the
    Secret)."""
    return hub(ask).admin.get(ask.conn, ask.arg("cluster_name"))


@routes.put(ONE)
def cluster_change(ask: Ask) -> Any:
    """Its display name, description, labels; a new kubeconfig (a Secret's cluster)."""
    return hub(ask).admin.change(ask.conn, ask.arg("cluster_name"), ask.body(), ask.now())


@routes.delete(ONE)
def cluster_remove(ask: Ask) -> Any:
    """Out of the multi-cluster Secret (its watches stop, its finalizers come off): 204."""
    hub(ask).admin.remove(ask.conn, ask.arg("cluster_name"))
    return Status(204)


@routes.put(f"{ONE}/default")
def cluster_default(ask: Ask) -> Any:
    """The cluster questions naming none are about from now on."""
    return hub(ask).admin.set_default(ask.conn, ask.arg("cluster_name"), ask.now())


@routes.post(f"{ONE}/test")
def cluster_test(ask: Ask) -> Any:
    """{cluster_name, k8s_connected, k8s_version or k8s_error, storage_connected}."""
    return hub(ask).admin.test(ask.arg("cluster_name"), ask.app.writer.up)


@routes.post(f"{ONE}/initialize")
def cluster_initialize(ask: Ask) -> Any:
    """The agent's DaemonSet, its RBAC and the rest of deploy/agent installed in the
    cluster, as a task the leader runs: {task_id, status, message}."""
    m = hub(ask)
    ask.body()  # checked: storage_mode and the rest are the original's, unused here
    return m.tasks.create(
        ask.conn,
        ask.arg("cluster_name"),
        "infrastructure",
        "initialize",
        ask.now(),
        who(ask),
        m.settings.agent_image(),
    )


@routes.get(f"{ONE}/infrastructure/status")
def infrastructure(ask: Ask) -> Any:
    """Whether the agent is installed there (initialized), the last initialize task."""
    m, name = hub(ask), ask.arg("cluster_name")
    got = m.admin.get(ask.conn, name)
    return tasks.infrastructure(
        ask.conn, name, got["infrastructure_status"], got["infrastructure_message"]
    )


def _limit(ask: Ask) -> int:
    n = integer(ask.query, "limit", 20)
    if not 1 <= n <= LIMIT_MAX:
        raise bad(f"limit={n}: from 1 to {LIMIT_MAX}")
    return n


def _task_id(ask: Ask) -> int:
    raw = ask.arg("task_id")
    if not raw.isdigit():
        raise bad("Invalid task_id")
    return inputs.whole(raw, "task_id")


@routes.get(
    f"{ONE}/tasks",
    SCOPE,
    Param("limit", "integer", "tasks", default=20, minimum=1, maximum=LIMIT_MAX),
)
def cluster_tasks(ask: Ask) -> Any:
    """?scope, limit (20): {data: [TaskResponse]}, newest first."""
    hub(ask).admin.get(ask.conn, ask.arg("cluster_name"))
    return tasks.listing(
        ask.conn, ask.arg("cluster_name"), param(ask.query, "scope") or "", _limit(ask)
    )


@routes.get(f"{ONE}/tasks/active", SCOPE)
def cluster_task_active(ask: Ask) -> Any:
    """The cluster's task under way (404 when none is)."""
    return tasks.active(ask.conn, ask.arg("cluster_name"), param(ask.query, "scope") or "")


@routes.get(f"{ONE}/tasks/{{task_id}}")
def cluster_task(ask: Ask) -> Any:
    """One task: its scope, stage, status, error."""
    return tasks.one(ask.conn, ask.arg("cluster_name"), _task_id(ask))


@routes.get(
    f"{ONE}/tasks/{{task_id}}/logs",
    Param("tail", "integer", "its last lines", default=500, minimum=1, maximum=100_000),
)
def cluster_task_logs(ask: Ask) -> Any:
    """?tail (500 lines): {task_id, job_name, pod_name, logs, log_lines}."""
    tail = integer(ask.query, "tail", 500)
    if not 1 <= tail <= 100_000:
        raise bad(f"tail={tail}: from 1 to 100000")
    return tasks.logs(ask.conn, ask.arg("cluster_name"), _task_id(ask), tail)


# -- the control plane's settings (the installer's image: the agent's) ---------------------------
def config_json(item: dict[str, Any]) -> dict[str, Any]:
    """ConfigResponse: its value an object ({"value": ...} for one of another type)."""
    value = item["value"]
    return {
        "id": item["id"],
        "key": item["key"],
        "value": value if isinstance(value, dict) else {"value": value},
        "description": item["description"],
        "category": item["category"],
        "version": item["version"],
        "updated_at": item["updated_at"] or "",
        "updated_by": item["updated_by"],
    }


@routes.get("management/config", Param("category"))
def configs(ask: Ask) -> Any:
    """?category: the settings that change at run time, and installer.image."""
    s, category = hub(ask).settings, param(ask.query, "category") or ""
    items = [config_json(i) for i in s.listing(ask.conn, "") if i["key"] in RUNTIME]
    items.append(installer_item(ask))
    return [i for i in items if not category or i["category"] == category]


def installer_item(ask: Ask) -> dict[str, Any]:
    s = hub(ask).settings
    got = config_json(s.get(ask.conn, "recorder.management.agent_image"))
    image = s.installer()
    return got | {
        "key": INSTALLER,
        "category": "installer",
        "value": {"repository": image["repository"], "tag": image["tag"]},
        "description": "the agent image Initialize installs",
    }


@routes.get("management/config/installer")
def installer(ask: Ask) -> Any:
    """{repository, tag, full_image}: the agent image Initialize installs."""
    return hub(ask).settings.installer()


@routes.get("management/config/{key}")
def config(ask: Ask) -> Any:
    """One control-plane setting (installer.image: the agent image)."""
    key = ask.arg("key")
    if key == INSTALLER:
        return installer_item(ask)
    return config_json(hub(ask).settings.get(ask.conn, key))


@routes.put("management/config/{key}")
def config_set(ask: Ask) -> Any:
    """{value, description, category}; installer.image's value {repository, tag} sets the
    agent image (recorder.management.agent_image), audited as any setting."""
    key, b = ask.arg("key"), ask.body()
    if key == INSTALLER:
        v = b.get("value")
        if (
            not isinstance(v, dict)
            or not isinstance(v.get("repository"), str)
            or not str(v.get("repository")).strip()
        ):
            raise bad("value: {repository, tag} is required")
        tag = str(v.get("tag") or "latest").strip()
        b = {**b, "value": f"{v['repository'].strip()}:{tag}"}
        key = "recorder.management.agent_image"
    elif isinstance(b.get("value"), dict) and set(b["value"]) == {"value"}:
        b = {**b, "value": b["value"]["value"]}  # as config_json shows it
    got = hub(ask).settings.set(ask.conn, key, b, ask.now(), who(ask))
    return {"message": "Configuration saved", "key": ask.arg("key"), "version": got["version"]}


@routes.delete("management/config/{key}")
def config_delete(ask: Ask) -> Any:
    """Back to the value the service started with: 204."""
    key = ask.arg("key")
    hub(ask).settings.delete(
        ask.conn,
        "recorder.management.agent_image" if key == INSTALLER else key,
        ask.now(),
        who(ask),
    )
    return Status(204)


# -- the surface ----------------------------------------------------------------------------------
def _with_error(got: Answer) -> Answer:
    """An envelope error with the original's {"error": message} beside its meta."""
    status, kind, raw = got[0], got[1], got[2]
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return got
    if isinstance(doc, dict) and isinstance(doc.get("meta"), dict) and "error" not in doc:
        doc["error"] = doc["meta"].get("message", "")
        raw = orjson.dumps(doc, option=JSON_OPTIONS)
    return (status, kind, raw, got[3]) if len(got) == 4 else (status, kind, raw)


class ManagementApi(Surface):
    """The management routes through the Primus-Lens surface (its parameters, its write
    credentials, one transaction per write), answered without its envelope."""

    def __init__(self, lens: Surface) -> None:
        self.lens = lens

    def call(self, route: Route, req: Request) -> Answer:
        got: list[Any] = []

        def keep(ask: Ask) -> None:
            got.append(route.handler(ask))

        wrapped = self.lens.call(dataclasses.replace(route, handler=keep), req)
        if not got or wrapped[0] != 200:
            return _with_error(wrapped)
        data = got[0]
        if isinstance(data, Status):
            if data.code == 204:
                return 204, "application/json", b""
            return answer(data.code, data.body)
        return answer(200, data)

    def max_body(self, route: Route) -> int:
        return self.lens.max_body(route)

    def admit(self, route: Route, head: Request) -> Answer | None:
        refused = self.lens.admit(route, head)
        return None if refused is None else _with_error(refused)

    def refuse(self, route: Route, status: int, message: str) -> Answer:
        return _with_error(self.lens.refuse(route, status, message))

    def missing(self, req: Request) -> Answer | None:
        got = self.lens.missing(req)
        return None if got is None else _with_error(got)

    def not_allowed(self, req: Request, method: str, allowed: list[str]) -> Answer | None:
        got = self.lens.not_allowed(req, method, allowed)
        return None if got is None else _with_error(got)
