"""A local stand-in for the Kubernetes API server: list (with limit/continue), get, and
watch as the real one streams it (chunked JSON lines, BOOKMARK events, a 410 ERROR
event for a compacted resourceVersion), plus kill/restart and dropped connections; create
(POST), replace (PUT), merge patch (PATCH) with the resourceVersion precondition (409),
DELETE that waits on finalizers (deletionTimestamp first, gone when the last finalizer
is removed), API discovery (/api/v1, /apis/<group>/<version>), and a custom resource
kind shaped like Kubeflow's PyTorchJob.

tests/kube/test_api_claims.py runs the same checks against this and a real kube-apiserver
(1.20.2); what it found is matched here: error Status bodies (message, reason, details)
word for word, continue tokens that carry the first page's resourceVersion (pages are a
snapshot of it, 410 Expired once compacted), list items without kind and apiVersion, the
DELETED event of a finalized object carrying its last stored state, a Status (not the
object) from an immediate DELETE, and Leases refusing an update without a
resourceVersion (422) and MicroTimes without six decimals (400). Kept on purpose: a
BOOKMARK (shaped as the real one) every `bookmark_interval` while a watch is idle (1.20.2's
watch cache sends them only in the last 2 s before timeoutSeconds, and only for a
resource that changed since it started; without the cache, none; 1.27+ about once a
minute), and the watch cache's wording of a 410 ("too old resource version: ..."; etcd's,
without the cache: "The resourceVersion for the provided watch is too old.")."""

from __future__ import annotations

import base64
import binascii
import contextlib
import copy
import json
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.conftest import wait_for

# collection -> (API prefix, kind, namespaced)
KINDS = {
    "pods": ("/api/v1", "Pod", True),
    "services": ("/api/v1", "Service", True),
    "nodes": ("/api/v1", "Node", False),
    "configmaps": ("/api/v1", "ConfigMap", True),
    "replicasets": ("/apis/apps/v1", "ReplicaSet", True),
    "deployments": ("/apis/apps/v1", "Deployment", True),
    "statefulsets": ("/apis/apps/v1", "StatefulSet", True),
    "daemonsets": ("/apis/apps/v1", "DaemonSet", True),
    "jobs": ("/apis/batch/v1", "Job", True),
    "cronjobs": ("/apis/batch/v1", "CronJob", True),
    "endpoints": ("/api/v1", "Endpoints", True),
    "pytorchjobs": ("/apis/kubeflow.org/v1", "PyTorchJob", True),
    "storageclasses": ("/apis/storage.k8s.io/v1", "StorageClass", False),
    "csidrivers": ("/apis/storage.k8s.io/v1", "CSIDriver", False),
    "persistentvolumes": ("/api/v1", "PersistentVolume", False),
    "persistentvolumeclaims": ("/api/v1", "PersistentVolumeClaim", True),
    "events": ("/api/v1", "Event", True),
    "secrets": ("/api/v1", "Secret", True),
    "leases": ("/apis/coordination.k8s.io/v1", "Lease", True),
}
# kinds whose update must name the resourceVersion it replaces (their strategy's
# AllowUnconditionalUpdate is false): a PUT without one is 422
NO_UNCONDITIONAL_UPDATE = {"leases"}
# kinds whose immediate DELETE answers the deleted object (ReturnDeletedObject); the
# others answer a Success Status
RETURN_DELETED = {"pods"}
SNAPSHOTS = 32  # list snapshots kept for continue tokens
# metav1.MicroTime fields: stored in UTC with six decimals, refused without them
MICRO_TIMES = {"leases": ("acquireTime", "renewTime")}
_MICRO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)")
# fields the server owns: an update that leaves them out keeps them (a controller's status
# update does not drop the finalizers others put on)
SERVER_METADATA = ("uid", "creationTimestamp", "finalizers", "deletionTimestamp")


def eventually(check: Callable[[], Any], timeout: float = 2.0, every: float = 0.02) -> None:
    """Until check() holds. The timeout is a hang guard (tests.conftest.hang_guard), not a
    latency target: how fast a watch propagates is bench.k8s_index's figure."""
    code = getattr(check, "__code__", None)
    where = f" at {Path(code.co_filename).name}:{code.co_firstlineno}" if code else ""
    wait_for(check, f"truth of the check{where}", timeout, every)


def status(
    code: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
    }
    if details is not None:
        out["details"] = details
    out["code"] = code
    return out


def group_version(coll: str) -> str:
    """The apiVersion of a collection's objects ("v1", "batch/v1")."""
    return KINDS[coll][0].removeprefix("/apis/").removeprefix("/api/")


def resource(coll: str) -> str:
    """The name errors give a collection: its plural, qualified by a named group
    ("configmaps", "jobs.batch", "leases.coordination.k8s.io")."""
    gv = group_version(coll)
    return f"{coll}.{gv.split('/')[0]}" if "/" in gv else coll


def details(coll: str, name: str, kind: str = "", **more: Any) -> dict[str, Any]:
    """A Status's details: the name, the group (when named), the kind (the plural unless
    given) and more (uid, causes)."""
    out: dict[str, Any] = {"name": name}
    gv = group_version(coll)
    if "/" in gv:
        out["group"] = gv.split("/")[0]
    return {**out, "kind": kind or coll, **more}


def not_found(coll: str, name: str) -> dict[str, Any]:
    return status(404, "NotFound", f'{resource(coll)} "{name}" not found', details(coll, name))


def conflict(coll: str, name: str) -> dict[str, Any]:
    return status(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {resource(coll)} "{name}": '
        "the object has been modified; please apply your changes to the latest "
        "version and try again",
        details(coll, name),
    )


def already_exists(coll: str, name: str) -> dict[str, Any]:
    return status(
        409, "AlreadyExists", f'{resource(coll)} "{name}" already exists', details(coll, name)
    )


def no_new_finalizers(coll: str, name: str, new: set[str]) -> dict[str, Any]:
    """422 for finalizers added to an object being deleted, as 1.20 words it: the kind (not
    the plural) names it, and the cause is listed twice (validated twice on update)."""
    kind, gv = KINDS[coll][1], group_version(coll)
    qualified = f"{kind}.{gv.split('/')[0]}" if "/" in gv else kind  # "Job.batch"
    quoted = ", ".join(json.dumps(f) for f in sorted(new))  # Go's %#v of a []string
    why = (
        "Forbidden: no new finalizers can be added if the object is being deleted, found "
        f"new finalizers []string{{{quoted}}}"
    )
    cause = {"reason": "FieldValueForbidden", "message": why, "field": "metadata.finalizers"}
    return status(
        422,
        "Invalid",
        f'{qualified} "{name}" is invalid: metadata.finalizers: {why}',
        details(coll, name, kind, causes=[cause, dict(cause)]),
    )


def resource_version_required(coll: str, name: str) -> dict[str, Any]:
    why = "Invalid value: 0x0: must be specified for an update"
    cause = {"reason": "FieldValueInvalid", "message": why, "field": "metadata.resourceVersion"}
    return status(
        422,
        "Invalid",
        f'{resource(coll)} "{name}" is invalid: metadata.resourceVersion: {why}',
        details(coll, name, causes=[cause]),
    )


def micro_time(value: str) -> str:
    """A metav1.MicroTime as the API stores it (UTC, six decimals); ValueError for what
    Go's time.Parse(RFC3339Micro) refuses (no fraction, or not six digits of one)."""
    if not _MICRO.fullmatch(value):
        raise ValueError(f'parsing time "{value}" as "2006-01-02T15:04:05.000000Z07:00"')
    at = datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC)
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


CONTINUE_EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. You can "
    "start a new list without the continue parameter, or use the continue token in this "
    "response to retrieve the remainder of the results. Continuing with the provided token "
    "results in an inconsistent list - objects that were created, modified, or deleted "
    "between the time the first chunk was returned and now may show up in the list."
)


def continue_token(rv: int, start: str) -> str:
    """The real server's token: unpadded URL-safe base64 of the list's resourceVersion and
    the key to go on from (-1: no longer consistent, go on from the latest)."""
    doc = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start}, separators=(",", ":"))
    return base64.urlsafe_b64encode(doc.encode()).decode().rstrip("=")


def _read_token(token: str) -> tuple[int, str]:
    """(resourceVersion, start key) of a continue token; ValueError when it is none."""
    try:
        doc = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        return int(doc["rv"]), str(doc["start"])
    except (binascii.Error, ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"invalid continue token: {exc}") from None


def list_key(obj: dict[str, Any], in_namespace: bool) -> str:
    """An object's etcd key below the list's prefix: lists come in this order, and a
    continue token names the key to go on after."""
    meta = obj["metadata"]
    ns = meta.get("namespace", "")
    return str(meta["name"]) if in_namespace or not ns else f"{ns}/{meta['name']}"


class FakeApiServer:
    """Objects live across kill/restart, as etcd's would."""

    def __init__(self, bookmark_interval: float = 0.3) -> None:
        self.cond = threading.Condition()
        self.rv = 1000
        self.objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {k: {} for k in KINDS}
        self.log: dict[str, list[tuple[int, str, dict[str, Any]]]] = {k: [] for k in KINDS}
        self.compacted: dict[str, int] = dict.fromkeys(KINDS, 0)
        # (collection, namespace, resourceVersion) -> the items a paged list started with:
        # its continue tokens read that snapshot, as etcd reads the first page's revision
        self.snapshots: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
        self.bookmark_interval = bookmark_interval
        self.requests: list[str] = []
        self.fail_gets: set[str] = set()  # collections whose GETs answer 500
        self.fail_writes: set[str] = set()  # collections whose PATCH/PUT/DELETE answer 500
        self._streams: set[socket.socket] = set()
        self._httpd: ThreadingHTTPServer | None = None
        self.port = 0

    # -- state ------------------------------------------------------------
    def put(self, coll: str, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        key = (meta.get("namespace", ""), meta["name"])
        with self.cond:
            old = self.objects[coll].get(key)
            for field in SERVER_METADATA:
                if old is not None and field not in meta and field in old["metadata"]:
                    meta[field] = copy.deepcopy(old["metadata"][field])
            if meta.get("deletionTimestamp") and not meta.get("finalizers"):
                # the last finalizer is gone: the update is not stored, the object is
                # deleted; the DELETED event carries the last stored state, the answer
                # the update with the resourceVersion it replaced
                if old is not None:
                    meta["resourceVersion"] = old["metadata"].get("resourceVersion", "")
                self._remove(coll, key, old if old is not None else obj)
                return obj
            self.rv += 1
            obj = {
                "kind": KINDS[coll][1],
                "apiVersion": group_version(coll),
                **{k: v for k, v in obj.items() if k not in ("kind", "apiVersion")},
            }
            meta = obj["metadata"]
            meta["resourceVersion"] = str(self.rv)
            meta.setdefault("uid", f"uid-{coll}-{key[0]}-{key[1]}")
            meta.setdefault("creationTimestamp", _now())
            kind = "MODIFIED" if key in self.objects[coll] else "ADDED"
            self.objects[coll][key] = obj
            self.log[coll].append((self.rv, kind, obj))
            self.cond.notify_all()
        return obj

    def get(self, coll: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self.cond:
            obj = self.objects[coll].get((namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def request_delete(self, coll: str, namespace: str, name: str) -> None:
        """What kubectl delete asks: gone now, or, when finalizers hold the object, marked
        with a deletionTimestamp until the last one is removed."""
        with self.cond:
            obj = copy.deepcopy(self.objects[coll][(namespace, name)])
            meta = obj["metadata"]
            if not meta.get("finalizers"):
                self._remove(coll, (namespace, name), obj)
                return
            if not meta.get("deletionTimestamp"):
                meta["deletionTimestamp"] = _now()
                meta["deletionGracePeriodSeconds"] = 0
                self.put(coll, obj)

    def _remove(self, coll: str, key: tuple[str, str], obj: dict[str, Any]) -> None:
        with self.cond:
            self.objects[coll].pop(key, None)
            self.rv += 1
            obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self.rv)}}
            self.log[coll].append((self.rv, "DELETED", obj))
            self.cond.notify_all()

    def delete(self, coll: str, namespace: str, name: str) -> None:
        with self.cond:
            obj = self.objects[coll].pop((namespace, name))
            self.rv += 1
            obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self.rv)}}
            self.log[coll].append((self.rv, "DELETED", obj))
            self.cond.notify_all()

    def compact(self) -> None:
        """Forget history: a watch from any resourceVersion seen so far gets 410 Gone, and
        so does a continue token; a list made after it gives a version a watch can start
        from (a version is skipped, as etcd's compaction sits past the latest one)."""
        with self.cond:
            self.rv += 1
            for coll in KINDS:
                self.compacted[coll] = self.rv
                self.log[coll] = []
            self.snapshots.clear()

    def drop_watches(self) -> None:
        """Cut every open watch connection (a load balancer resetting idle streams)."""
        with self.cond:
            streams = list(self._streams)
        for s in streams:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def open_watches(self) -> int:
        with self.cond:
            return len(self._streams)

    def lists(self, coll: str) -> int:
        prefix = KINDS[coll][0] + f"/{coll}?"
        return sum(1 for r in self.requests if r.startswith(prefix) and "watch=" not in r)

    def watches(self, coll: str) -> int:
        prefix = KINDS[coll][0] + f"/{coll}?"
        return sum(1 for r in self.requests if r.startswith(prefix) and "watch=" in r)

    # -- serving ----------------------------------------------------------
    def start(self) -> FakeApiServer:
        server = self

        class Handler(_Handler):
            api = server

        ThreadingHTTPServer.allow_reuse_address = True
        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def kill(self) -> None:
        """Stop listening and cut every connection, as a crashed API server would."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        self.drop_watches()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "lab",
                    "clusters": [{"name": "lab", "cluster": {"server": self.url}}],
                    "users": [{"name": "lab", "user": {"token": "lab-token"}}],
                    "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "lab"}}],
                }
            )
        )
        return path


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge_patch(out.get(key), value)
    return out


def discovery(path: str) -> dict[str, Any] | None:
    """The APIResourceList of /api/v1 or /apis/<group>/<version>, from KINDS."""
    found = [
        (coll, kind, namespaced)
        for coll, (prefix, kind, namespaced) in KINDS.items()
        if prefix == path
    ]
    if not found:
        return None
    group_version = path.removeprefix("/apis/").removeprefix("/api/")
    verbs = ["create", "delete", "get", "list", "patch", "update", "watch"]
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": [
            {
                "name": coll,
                "singularName": kind.lower(),
                "namespaced": namespaced,
                "kind": kind,
                "verbs": verbs,
            }
            for coll, kind, namespaced in found
        ],
    }


def _route(path: str) -> tuple[str, str, str] | None:
    """(collection, namespace, name) of an API path; name empty for a list."""
    for coll, (prefix, _, namespaced) in KINDS.items():
        if not path.startswith(prefix + "/"):
            continue
        rest = path[len(prefix) + 1 :].split("/")
        if rest[0] == coll and len(rest) <= 2 and not (namespaced and len(rest) == 2):
            return coll, "", rest[1] if len(rest) == 2 else ""
        if namespaced and len(rest) >= 3 and rest[0] == "namespaces" and rest[2] == coll:
            return coll, rest[1], rest[3] if len(rest) == 4 else ""
    return None


class _Handler(BaseHTTPRequestHandler):
    api: FakeApiServer
    protocol_version = "HTTP/1.1"
    # headers and body go out as separate writes: without this, Nagle plus the client's
    # delayed ACK add 40 ms to every keep-alive request (a real API server has no such lag)
    disable_nagle_algorithm = True

    def log_message(self, *args: Any) -> None:
        pass

    def _json(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        self.api.requests.append(self.path)
        if url.path.rstrip("/") == "/version":
            self._json(
                200,
                {
                    "major": "1",
                    "minor": "31",
                    "gitVersion": "v1.31.2",
                    "gitCommit": "5864a4677267e6adeae276ad85882a8714d69d9d",
                    "gitTreeState": "clean",
                    "buildDate": "2024-10-22T20:28:14Z",
                    "goVersion": "go1.22.8",
                    "compiler": "gc",
                    "platform": "linux/amd64",
                },
            )
            return
        route = _route(url.path)
        if route is None:
            found = discovery(url.path.rstrip("/"))
            if found is not None:
                self._json(200, found)
            else:
                self._json(404, status(404, "NotFound", f"no route {url.path}"))
            return
        coll, ns, name = route
        if query.get("watch") in ("true", "1"):
            self._watch(coll, ns, query)
            return
        if name:
            with self.api.cond:
                fail = coll in self.api.fail_gets
                obj = self.api.objects[coll].get((ns, name))
            if fail:
                self._json(500, status(500, "InternalError", "etcd is unhappy"))
            elif obj is None:
                self._json(404, not_found(coll, name))
            else:
                self._json(200, obj)
            return
        self._list(coll, ns, query)

    def _list(self, coll: str, ns: str, query: dict[str, str]) -> None:
        """One page; with a continue token, the next page of the snapshot the first page
        was cut from (its resourceVersion), 410 once that version is compacted away."""
        api = self.api
        token = query.get("continue") or ""
        start = ""
        with api.cond:
            if token:
                try:
                    rv, start = _read_token(token)
                except ValueError as exc:
                    self._json(400, status(400, "BadRequest", str(exc)))
                    return
                if 0 <= rv < api.compacted[coll]:
                    gone = status(410, "Expired", CONTINUE_EXPIRED)
                    gone["metadata"] = {"continue": continue_token(-1, start)}
                    self._json(410, gone)
                    return
                items = api.snapshots.get((coll, ns, rv)) if rv >= 0 else None
                if items is None:  # -1, or a snapshot no longer kept: the latest
                    rv, items = api.rv, self._items(coll, ns)
            else:
                rv, items = api.rv, self._items(coll, ns)
            items = [o for o in items if list_key(o, bool(ns)) >= start]
            limit = int(query.get("limit") or 0) or len(items) or 1
            meta: dict[str, Any] = {"resourceVersion": str(rv)}
            if len(items) > limit:
                if not token:
                    api.snapshots[(coll, ns, rv)] = items
                    while len(api.snapshots) > SNAPSHOTS:
                        api.snapshots.pop(next(iter(api.snapshots)))
                meta["continue"] = continue_token(rv, list_key(items[limit - 1], bool(ns)) + "\0")
                meta["remainingItemCount"] = len(items) - limit
            # a list's items carry no kind or apiVersion: the list's own say it
            page = [
                {k: v for k, v in o.items() if k not in ("kind", "apiVersion")}
                for o in items[:limit]
            ]
        self._json(
            200,
            {
                "kind": f"{KINDS[coll][1]}List",
                "apiVersion": group_version(coll),
                "metadata": meta,
                "items": page,
            },
        )

    def _items(self, coll: str, ns: str) -> list[dict[str, Any]]:
        """The collection (or one namespace of it) in etcd's key order. Holding the lock."""
        found = (o for (ons, _), o in self.api.objects[coll].items() if not ns or ons == ns)
        return sorted(found, key=lambda o: list_key(o, bool(ns)))

    def _body(self) -> Any:
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")

    def _one(self) -> tuple[str, str, str, dict[str, Any]] | None:
        """The object a write names, answering 404 itself when there is none."""
        url = urllib.parse.urlsplit(self.path)
        self.api.requests.append(f"{self.command} {self.path}")
        route = _route(url.path)
        if route is None or not route[2]:
            self._json(404, status(404, "NotFound", f"no route {url.path}"))
            return None
        coll, ns, name = route
        if coll in self.api.fail_writes:
            self._json(500, status(500, "InternalError", "etcd is unhappy"))
            return None
        obj = self.api.get(coll, ns, name)
        if obj is None:
            self._json(404, not_found(coll, name))
            return None
        return coll, ns, name, obj

    def _target(self) -> tuple[str, str, str, dict[str, Any], dict[str, Any]] | None:
        """(collection, namespace, name, stored object, request body) of a PATCH or PUT,
        answering 404 or 409 (a resourceVersion precondition that fails) itself. Call it
        holding the API's lock, so that the check and the write are one step."""
        body = self._body()
        found = self._one()
        if found is None:
            return None
        coll, ns, name, obj = found
        want = (body.get("metadata") or {}).get("resourceVersion")
        if want and str(want) != obj["metadata"].get("resourceVersion"):
            self._json(409, conflict(coll, name))
            return None
        return coll, ns, name, obj, body

    def _decodes(self, coll: str, obj: dict[str, Any]) -> bool:
        """Stores its MicroTime fields as the API does; answers 400 when one is not one."""
        spec = obj.get("spec")
        if coll not in MICRO_TIMES or not isinstance(spec, dict):
            return True
        obj["spec"] = spec = dict(spec)  # a merge patch shares what it left alone
        for field in MICRO_TIMES[coll]:
            if spec.get(field) is None:
                continue
            try:
                spec[field] = micro_time(str(spec[field]))
            except ValueError as exc:
                kind, version = KINDS[coll][1], group_version(coll).split("/")[-1]
                self._json(
                    400,
                    status(
                        400,
                        "BadRequest",
                        f'{kind} in version "{version}" ' f"cannot be handled as a {kind}: {exc}",
                    ),
                )
                return False
        return True

    def _adds_finalizers(
        self, coll: str, name: str, old: dict[str, Any], new: dict[str, Any]
    ) -> bool:
        """Answers 422 when an update adds finalizers to an object being deleted."""
        if not old["metadata"].get("deletionTimestamp"):
            return False
        added = set(new["metadata"].get("finalizers") or ()) - set(
            old["metadata"].get("finalizers") or ()
        )
        if added:
            self._json(422, no_new_finalizers(coll, name, added))
        return bool(added)

    def do_PATCH(self) -> None:  # noqa: N802
        if "json-patch" in (self.headers.get("Content-Type") or ""):
            self._body()
            self._json(415, status(415, "UnsupportedMediaType", "only merge patches here"))
            return
        with self.api.cond:
            target = self._target()
            if target is None:
                return
            coll, _, name, obj, patch = target
            new = _merge_patch(obj, patch)
            if self._adds_finalizers(coll, name, obj, new) or not self._decodes(coll, new):
                return
            if "finalizers" in (patch.get("metadata") or {}):
                # [] and null both clear them
                new["metadata"]["finalizers"] = new["metadata"].get("finalizers") or []
            new["metadata"].pop("resourceVersion", None)
            self._json(200, self.api.put(coll, new))

    def do_PUT(self) -> None:  # noqa: N802
        with self.api.cond:
            target = self._target()
            if target is None:
                return
            coll, ns, name, obj, body = target
            body.setdefault("metadata", {}).update(namespace=ns, name=name)
            if coll in NO_UNCONDITIONAL_UPDATE and not body["metadata"].get("resourceVersion"):
                self._json(422, resource_version_required(coll, name))
                return
            if self._adds_finalizers(coll, name, obj, body) or not self._decodes(coll, body):
                return
            body["metadata"].pop("resourceVersion", None)
            self._json(200, self.api.put(coll, body))

    def do_POST(self) -> None:  # noqa: N802
        body = self._body()
        url = urllib.parse.urlsplit(self.path)
        self.api.requests.append(f"POST {self.path}")
        route = _route(url.path)
        if route is None or route[2]:
            self._json(404, status(404, "NotFound", f"no route {url.path}"))
            return
        coll, ns, _ = route
        meta = body.setdefault("metadata", {})
        meta["namespace"] = ns
        if not self._decodes(coll, body):
            return
        with self.api.cond:
            if self.api.get(coll, ns, meta.get("name", "")) is not None:
                self._json(409, already_exists(coll, str(meta.get("name"))))
                return
            self._json(201, self.api.put(coll, body))

    def do_DELETE(self) -> None:  # noqa: N802
        if self.headers.get("Content-Length"):
            self._body()
        found = self._one()
        if found is None:
            return
        coll, ns, name, obj = found
        self.api.request_delete(coll, ns, name)
        held = self.api.get(coll, ns, name)
        if held is not None or coll in RETURN_DELETED:
            self._json(200, held or obj)  # held by finalizers: the object, being deleted
            return
        uid = obj["metadata"].get("uid", "")
        self._json(
            200,
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": details(coll, name, uid=uid),
            },
        )

    def _chunk(self, event: dict[str, Any]) -> None:
        data = json.dumps(event).encode() + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _watch(self, coll: str, ns: str, query: dict[str, str]) -> None:
        api = self.api
        since = int(query.get("resourceVersion") or 0)
        initial: list[dict[str, Any]] = []
        if since == 0:  # "" or "0": the current state as ADDED events, then what follows
            with api.cond:
                since, initial = api.rv, self._items(coll, ns)
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or 1800)
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        with api.cond:
            api._streams.add(self.connection)
        try:
            if since < api.compacted[coll]:
                msg = f"too old resource version: {since} ({api.compacted[coll]})"
                self._chunk({"type": "ERROR", "object": status(410, "Expired", msg)})
            else:
                for obj in initial:
                    self._chunk({"type": "ADDED", "object": obj})
                self._stream(coll, ns, since, deadline, bookmarks)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            self.close_connection = True
        finally:
            with api.cond:
                api._streams.discard(self.connection)

    def _stream(self, coll: str, ns: str, since: int, deadline: float, bookmarks: bool) -> None:
        api = self.api
        while time.monotonic() < deadline:
            with api.cond:
                pending = [e for e in api.log[coll] if e[0] > since]
                if not pending:
                    api.cond.wait(api.bookmark_interval)
                    pending = [e for e in api.log[coll] if e[0] > since]
                rv = api.rv
            if api._httpd is None:
                raise OSError("server killed")
            for erv, kind, obj in pending:
                since = erv
                if not ns or obj["metadata"].get("namespace") == ns:
                    self._chunk({"type": kind, "object": obj})
            if not pending and bookmarks:
                since = max(since, rv)
                self._chunk(
                    {
                        "type": "BOOKMARK",
                        "object": {
                            "kind": KINDS[coll][1],
                            "apiVersion": group_version(coll),
                            "metadata": {"resourceVersion": str(since), "creationTimestamp": None},
                        },
                    }
                )


def pod(
    name: str,
    ip: str,
    namespace: str = "default",
    *,
    node: str = "node-a",
    owner: tuple[str, str] | None = None,
    host_network: bool = False,
    phase: str = "Running",
    containers: list[dict[str, Any]] | None = None,
    init_containers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A Pod as the API serves it (the fields the agent reads, and a few it does not)."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{name}",
        "labels": {"app": name},
    }
    if owner:
        meta["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": owner[0],
                "name": owner[1],
                "uid": f"uid-{owner[1]}",
                "controller": True,
            }
        ]
    spec: dict[str, Any] = {
        "nodeName": node,
        "containers": containers or [{"name": "main", "image": "busybox", "resources": {}}],
    }
    if init_containers:
        spec["initContainers"] = init_containers
    if host_network:
        spec["hostNetwork"] = True
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": spec,
        "status": {
            "phase": phase,
            "podIP": ip,
            "podIPs": [{"ip": ip}] if ip else [],
            "hostIP": "192.0.2.10",
        },
    }


def service(name: str, cluster_ip: str, namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": cluster_ip,
            "clusterIPs": [cluster_ip],
            "ports": [{"port": 80, "protocol": "TCP"}],
        },
    }


def owned(
    kind: str, name: str, namespace: str = "default", owner: tuple[str, str] | None = None
) -> dict[str, Any]:
    """A workload object (ReplicaSet, Deployment, Job, ...) with an optional controller."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if owner:
        meta["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": owner[0],
                "name": owner[1],
                "uid": f"uid-{owner[1]}",
                "controller": True,
            }
        ]
    return {"kind": kind, "metadata": meta}
