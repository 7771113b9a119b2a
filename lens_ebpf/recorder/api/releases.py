"""The Release Management page's routes (releases/...): the lens-ebpf versions offered and
seen, which one each cluster runs (its agent DaemonSet's image) and should run, the
default cluster, deploy and rollback as tasks, their history."""

from __future__ import annotations

from typing import Any

from lens_ebpf.core.routes import Param, RouteTable
from lens_ebpf.recorder import inputs
from lens_ebpf.recorder.api.envelope import Ask, bad, integer, param
from lens_ebpf.recorder.api.management import hub, who

routes = RouteTable()
VERSIONS = "releases/versions"
CLUSTER = "releases/clusters/{cluster_name}"


def ident(ask: Ask) -> int:
    raw = ask.arg("id")
    if not raw.isdigit():
        raise bad("invalid id")
    return inputs.whole(raw, "id")


@routes.get(VERSIONS, Param("channel"), Param("status", choices=("draft", "active", "deprecated")))
def versions(ask: Ask) -> Any:
    """?channel, status: every version, newest first (those seen running: channel
    observed)."""
    return hub(ask).releases.versions(
        ask.conn, param(ask.query, "channel") or "", param(ask.query, "status") or ""
    )


@routes.post(VERSIONS)
def version_create(ask: Ask) -> Any:
    """{version_name, image_tag, image_registry, channel, chart_repo, chart_version,
    default_values, release_notes}: a draft version."""
    return hub(ask).releases.create_version(ask.conn, ask.body(), ask.now())


@routes.get(f"{VERSIONS}/{{id}}")
def version(ask: Ask) -> Any:
    """One release version: its image registry and tag, channel, status, notes."""
    return hub(ask).releases.version(ask.conn, ident(ask))


@routes.put(f"{VERSIONS}/{{id}}")
def version_update(ask: Ask) -> Any:
    """Only the fields given."""
    return hub(ask).releases.update_version(ask.conn, ident(ask), ask.body(), ask.now())


@routes.delete(f"{VERSIONS}/{{id}}")
def version_delete(ask: Ask) -> Any:
    """A version no cluster runs or should run."""
    return hub(ask).releases.delete_version(ask.conn, ident(ask))


@routes.patch(f"{VERSIONS}/{{id}}/status")
def version_status(ask: Ask) -> Any:
    """{status: draft, active or deprecated}."""
    return hub(ask).releases.set_status(
        ask.conn, ident(ask), str(ask.body().get("status") or ""), ask.now()
    )


@routes.get("releases/clusters")
def clusters(ask: Ask) -> Any:
    """Every cluster's ClusterReleaseConfig: the version it runs (its agent's image), the
    one it should, in sync or not."""
    return hub(ask).releases.configs(ask.conn)


@routes.get("releases/clusters/default")
def default(ask: Ask) -> Any:
    """{default_cluster, cluster_id, explicit}: the cluster questions naming none are about
    (the home one unless one is set)."""
    m = hub(ask)
    name = m.admin.default_name()
    ids = {c["cluster_name"]: c["id"] for c in m.admin.listing(ask.conn)}
    return {
        "default_cluster": name,
        "cluster_id": ids.get(name, 0),
        "explicit": bool(m.admin.clusters.default),
    }


@routes.put("releases/clusters/default")
def default_set(ask: Ask) -> Any:
    """{cluster_name}."""
    name = ask.body().get("cluster_name")
    if not isinstance(name, str) or not name:
        raise bad("cluster_name is required")
    got = hub(ask).admin.set_default(ask.conn, name, ask.now())
    return {"message": "default cluster set", "default_cluster": got["cluster_name"]}


@routes.delete("releases/clusters/default")
def default_clear(ask: Ask) -> Any:
    """The home cluster is the default again."""
    return hub(ask).admin.clear_default(ask.conn, ask.now())


@routes.get(CLUSTER)
def cluster(ask: Ask) -> Any:
    """One cluster's: the version it runs (its agent's image) and should run, in sync or
    not."""
    return hub(ask).releases.config(ask.conn, ask.arg("cluster_name"))


@routes.put(f"{CLUSTER}/version")
def cluster_version(ask: Ask) -> Any:
    """{release_version_id, values_override}: the version it should run."""
    return hub(ask).releases.set_version(ask.conn, ask.arg("cluster_name"), ask.body(), ask.now())


@routes.put(f"{CLUSTER}/values")
def cluster_values(ask: Ask) -> Any:
    """{values_override}."""
    return hub(ask).releases.set_values(ask.conn, ask.arg("cluster_name"), ask.body(), ask.now())


@routes.get(
    f"{CLUSTER}/history", Param("limit", "integer", "entries", default=20, minimum=1, maximum=1000)
)
def cluster_history(ask: Ask) -> Any:
    """?limit (20): its deploys, rollbacks and initializations, newest first."""
    limit = integer(ask.query, "limit", 20)
    if not 1 <= limit <= 1000:
        raise bad(f"limit={limit}: from 1 to 1000")
    return hub(ask).releases.history(ask.conn, ask.arg("cluster_name"), limit)


@routes.post(f"{CLUSTER}/deploy")
def cluster_deploy(ask: Ask) -> Any:
    """{action}: its version installed (the agent's objects with its image), as a task."""
    return hub(ask).releases.deploy(
        ask.conn, ask.arg("cluster_name"), ask.body(), ask.now(), who(ask)
    )


@routes.post(f"{CLUSTER}/rollback")
def cluster_rollback(ask: Ask) -> Any:
    """The version deployed before the current one, installed again."""
    return hub(ask).releases.rollback(ask.conn, ask.arg("cluster_name"), ask.now(), who(ask))


@routes.get("releases/history/{id}")
def history(ask: Ask) -> Any:
    """One deploy, rollback or initialization of a cluster."""
    return hub(ask).releases.history_one(ask.conn, ident(ask))
