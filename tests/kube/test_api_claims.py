"""What tests/k8slab.py's stand-in claims to do as the API server does, checked by the same
test code against the stand-in and against a real kube-apiserver 1.20.2 (tests/kube/
apiserver.py), through the project's own clients: the Reflector lists (paged) and
watches, LeaseApi writes Leases, the recorder's DynamicApi and change_finalizer put its
finalizer on a Job and take it off, and the kubernetes client that api_client() builds
does the rest.

The real server runs with --watch-cache=false, so that watches and continued lists read
etcd and compacting etcd sends them 410 at once (the watch cache would serve them from
its own window of recent events). 1.20.2 sends no BOOKMARK before a watch's
timeoutSeconds, so nothing here waits on one.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest

from lens_ebpf.k8s import reflector
from lens_ebpf.k8s.client import api_client
from lens_ebpf.k8s.dynamic import DynamicApi, Kind
from lens_ebpf.k8s.election import LeaseApi
from lens_ebpf.k8s.reflector import Reflector, call_raw
from lens_ebpf.recorder import lifecycle as lc
from lens_ebpf.recorder.tracker import change_finalizer
from tests.conftest import hang_guard, wait_for
from tests.k8slab import FakeApiServer
from tests.kube import apiserver
from tests.kube.apiserver import KubeApiServer

TIMEOUT = 10.0  # per request, and the hang guard of a watch


@dataclass
class Backend:
    name: str
    client: Any  # a kubernetes ApiClient from lens_ebpf.k8s.client.api_client
    compact: Callable[[], object]  # no resourceVersion seen so far is watchable after it
    make_namespace: Callable[[str], None]
    request: Callable[[str, str, Any], tuple[int, Any]]  # plain HTTP: (status, JSON body)


def plain_request(url: str, method: str, path: str, body: Any) -> tuple[int, Any]:
    """One JSON request to the stand-in (no TLS, no token checked)."""
    req = urllib.request.Request(
        url + path,
        data=json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=hang_guard(TIMEOUT)) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.fixture(scope="module", params=["stand-in", "kube-apiserver"])
def backend(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Backend]:
    """One server per module for each backend; every test works in a namespace of its own."""
    where = tmp_path_factory.mktemp(request.param)
    if request.param == "stand-in":
        fake = FakeApiServer().start()
        client = api_client("kubeconfig", str(fake.kubeconfig(where / "kubeconfig")))
        yield Backend(
            request.param, client, fake.compact, lambda ns: None, partial(plain_request, fake.url)
        )
        client.close()
        fake.kill()
        return
    why = apiserver.unavailable()
    if why:
        pytest.skip(why)
    with KubeApiServer(["--watch-cache=false"]) as lab:

        def make_namespace(ns: str) -> None:
            code, got = lab.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
            assert code == 201, got

        client = api_client("kubeconfig", str(lab.admin_kubeconfig))
        yield Backend(request.param, client, lab.compact, make_namespace, lab.request)
        client.close()


_numbers = itertools.count()


@pytest.fixture
def ns(backend: Backend) -> str:
    name = f"claims-{next(_numbers)}"
    backend.make_namespace(name)
    return name


def core(backend: Backend) -> Any:
    from kubernetes import client

    return client.CoreV1Api(backend.client)


def configmap(name: str, **data: str) -> dict[str, Any]:
    """With some data: the real server leaves an empty map out of its answers."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def job(name: str) -> dict[str, Any]:
    """A Job the real server's validation takes; nothing runs it (no controller-manager)."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "busybox:1.36", "command": ["true"]}],
                }
            }
        },
    }


def raw(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    return call_raw(fn, *args, timeout=TIMEOUT, **kwargs)


def refused(call: Callable[[], object]) -> tuple[int, dict[str, Any]]:
    """The status and the Status body of a call the server refuses."""
    from kubernetes.client.exceptions import ApiException

    with pytest.raises(ApiException) as err:
        call()
    body: dict[str, Any] = json.loads(err.value.body or "null")
    return int(err.value.status), body


def rv(obj: dict[str, Any]) -> int:
    return int(obj["metadata"]["resourceVersion"])


def token(text: str) -> dict[str, Any]:
    """A continue token's content (opaque to clients; checked here so that the stand-in's
    tokens stay what the real server's are)."""
    doc: dict[str, Any] = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    return doc


def watch(
    list_fn: Callable[..., Any], since: str, last: Callable[[dict[str, Any]], bool]
) -> list[dict[str, Any]]:
    """The events of a watch from `since` (BOOKMARKs left out), up to the first that `last`
    holds for, or until the server ends the stream (after an ERROR event)."""
    from kubernetes.watch.watch import iter_resp_lines

    guard = hang_guard(TIMEOUT)
    resp = list_fn(
        watch=True,
        resource_version=since,
        allow_watch_bookmarks=True,
        timeout_seconds=int(guard),
        _preload_content=False,
        _request_timeout=(guard, guard + 5),
    )
    events: list[dict[str, Any]] = []
    try:
        for line in iter_resp_lines(resp):
            event = json.loads(line) if line else {}
            if event and event["type"] != "BOOKMARK":
                events.append(event)
                if last(event):
                    break
    finally:
        resp.close()
        resp.release_conn()
    return events


def named(name: str) -> Callable[[dict[str, Any]], bool]:
    return lambda event: event["object"]["metadata"].get("name") == name


def brief(event: dict[str, Any]) -> tuple[str, str, dict[str, str] | None]:
    obj = event["object"]
    return event["type"], obj["metadata"].get("name", ""), obj.get("data")


class Seen:
    """What a Reflector handed on: each replace's (name, data), each event's."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.replaced: list[list[tuple[str, dict[str, str] | None]]] = []
        self.events: list[tuple[str, str, dict[str, str] | None]] = []

    def replace(self, items: list[dict[str, Any]]) -> None:
        with self.lock:
            self.replaced.append([(o["metadata"]["name"], o.get("data")) for o in items])

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        with self.lock:
            self.events.append((kind, obj["metadata"]["name"], obj.get("data")))

    def names(self) -> list[str]:
        with self.lock:
            return [name for _, name, _ in self.events]


def configmap_reflector(backend: Backend, ns: str, seen: Seen) -> Reflector:
    return Reflector(
        "configmaps",
        partial(core(backend).list_namespaced_config_map, ns),
        seen.replace,
        seen.event,
        request_timeout=TIMEOUT,
        watch_timeout=30,
        backoff_max=1.0,
    )


@contextlib.contextmanager
def running(refl: Reflector) -> Iterator[None]:
    """The Reflector in a thread until the block ends (stop it only once its watch is
    open: a watch being opened is not cut)."""
    stop = threading.Event()
    th = threading.Thread(target=refl.run, args=(stop,), name="claims-reflector", daemon=True)
    th.start()
    try:
        yield
    finally:
        stop.set()
        refl.stop()
        th.join(hang_guard(TIMEOUT))
        assert not th.is_alive(), "the Reflector did not stop"


# -- list pagination ---------------------------------------------------------------------


def test_a_list_pages_by_limit_over_the_first_pages_snapshot(
    backend: Backend, ns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = core(backend)
    for i in range(7):
        raw(api.create_namespaced_config_map, ns, configmap(f"cm-{i}", i=str(i)))
    listed = partial(raw, api.list_namespaced_config_map, ns, limit=3)

    first = listed()
    version = first["metadata"]["resourceVersion"]
    assert (first["kind"], first["apiVersion"]) == ("ConfigMapList", "v1")
    assert first["metadata"] == {
        "resourceVersion": version,
        "continue": first["metadata"]["continue"],
        "remainingItemCount": 4,
    }
    assert token(first["metadata"]["continue"]) == {
        "v": "meta.k8s.io/v1",
        "rv": int(version),
        "start": "cm-2\0",
    }
    # a list's items carry neither kind nor apiVersion
    assert [sorted(o) for o in first["items"]] == [["data", "metadata"]] * 3
    # between pages: one added, one deleted, one changed; the pages go on with the snapshot
    raw(api.create_namespaced_config_map, ns, configmap("cm-7", i="7"))
    raw(api.delete_namespaced_config_map, "cm-4", ns)
    five = raw(api.read_namespaced_config_map, "cm-5", ns)
    raw(api.replace_namespaced_config_map, "cm-5", ns, {**five, "data": {"i": "five"}})

    second = listed(_continue=first["metadata"]["continue"])
    assert second["metadata"] == {
        "resourceVersion": version,
        "continue": second["metadata"]["continue"],
        "remainingItemCount": 1,
    }
    third = listed(_continue=second["metadata"]["continue"])
    assert third["metadata"] == {"resourceVersion": version}
    pages = [
        [(o["metadata"]["name"], o["data"]["i"]) for o in page["items"]]
        for page in (first, second, third)
    ]
    assert pages == [
        [("cm-0", "0"), ("cm-1", "1"), ("cm-2", "2")],
        [("cm-3", "3"), ("cm-4", "4"), ("cm-5", "5")],
        [("cm-6", "6")],
    ]

    # The Reflector pages the same way (3 at a time) and hands on the whole list at once.
    monkeypatch.setattr(reflector, "PAGE", 3)
    seen = Seen()
    refl = configmap_reflector(backend, ns, seen)
    with running(refl):
        wait_for(refl.synced.is_set, "the Reflector's first list", timeout=TIMEOUT)
        assert seen.replaced == [
            [
                ("cm-0", {"i": "0"}),
                ("cm-1", {"i": "1"}),
                ("cm-2", {"i": "2"}),
                ("cm-3", {"i": "3"}),
                ("cm-5", {"i": "five"}),
                ("cm-6", {"i": "6"}),
                ("cm-7", {"i": "7"}),
            ]
        ]
        raw(api.create_namespaced_config_map, ns, configmap("cm-8", i="8"))
        wait_for(lambda: seen.names() == ["cm-8"], "the watch after the paged list")
    assert refl.lists == 1


# -- watch resume ------------------------------------------------------------------------


def test_a_watch_from_a_resource_version_delivers_exactly_the_changes_after_it(
    backend: Backend, ns: str
) -> None:
    api = core(backend)
    a = raw(api.create_namespaced_config_map, ns, configmap("a", v="1"))
    b = raw(api.create_namespaced_config_map, ns, configmap("b", v="1"))
    c = raw(api.create_namespaced_config_map, ns, configmap("c", v="1"))
    a2 = raw(api.replace_namespaced_config_map, "a", ns, {**a, "data": {"v": "2"}})
    raw(api.delete_namespaced_config_map, "b", ns)
    end = raw(api.create_namespaced_config_map, ns, configmap("end", v="1"))
    listed = partial(api.list_namespaced_config_map, ns)

    events = watch(listed, str(rv(b)), named("end"))
    assert [brief(e) for e in events] == [
        ("ADDED", "c", {"v": "1"}),
        ("MODIFIED", "a", {"v": "2"}),
        ("DELETED", "b", {"v": "1"}),
        ("ADDED", "end", {"v": "1"}),
    ]
    versions = [rv(e["object"]) for e in events]
    assert versions[:2] == [rv(c), rv(a2)] and versions[3] == rv(end)
    assert rv(a2) < versions[2] < rv(end)  # the deletion's own version
    kinds = {(e["object"]["kind"], e["object"]["apiVersion"]) for e in events}
    assert kinds == {("ConfigMap", "v1")}

    # from the modification's version: what came after it, nothing before
    assert [brief(e) for e in watch(listed, str(rv(a2)), named("end"))] == [
        ("DELETED", "b", {"v": "1"}),
        ("ADDED", "end", {"v": "1"}),
    ]
    # with no version: the current state as ADDED events, in name order
    assert [brief(e) for e in watch(listed, "", named("end"))] == [
        ("ADDED", "a", {"v": "2"}),
        ("ADDED", "c", {"v": "1"}),
        ("ADDED", "end", {"v": "1"}),
    ]


def test_a_reflector_restarted_from_its_last_version_misses_and_repeats_nothing(
    backend: Backend, ns: str
) -> None:
    api = core(backend)
    a = raw(api.create_namespaced_config_map, ns, configmap("a", v="1"))
    raw(api.create_namespaced_config_map, ns, configmap("b", v="1"))
    seen = Seen()
    refl = configmap_reflector(backend, ns, seen)
    with running(refl):
        wait_for(refl.synced.is_set, "the Reflector's first list", timeout=TIMEOUT)
        raw(api.create_namespaced_config_map, ns, configmap("c", v="1"))
        wait_for(lambda: seen.names() == ["c"], "the event of c")
    stopped_at = refl.resource_version
    # while it is down
    raw(api.replace_namespaced_config_map, "a", ns, {**a, "data": {"v": "2"}})
    raw(api.delete_namespaced_config_map, "b", ns)
    raw(api.create_namespaced_config_map, ns, configmap("d", v="1"))

    with running(refl):
        raw(api.create_namespaced_config_map, ns, configmap("end", v="1"))
        wait_for(lambda: "end" in seen.names(), "the event of end")
    assert seen.replaced == [[("a", {"v": "1"}), ("b", {"v": "1"})]]
    assert seen.events == [
        ("ADDED", "c", {"v": "1"}),
        ("MODIFIED", "a", {"v": "2"}),
        ("DELETED", "b", {"v": "1"}),
        ("ADDED", "d", {"v": "1"}),
        ("ADDED", "end", {"v": "1"}),
    ]
    assert (refl.lists, refl.restarts["gone"]) == (1, 0)
    assert int(refl.resource_version) > int(stopped_at)


# -- 410 Gone after compaction -----------------------------------------------------------


def test_after_compaction_a_watch_gets_410_and_the_reflector_lists_again(
    backend: Backend, ns: str
) -> None:
    api = core(backend)
    a = raw(api.create_namespaced_config_map, ns, configmap("a", v="1"))
    raw(api.create_namespaced_config_map, ns, configmap("b", v="1"))
    seen = Seen()
    refl = configmap_reflector(backend, ns, seen)
    with running(refl):
        wait_for(refl.synced.is_set, "the Reflector's first list", timeout=TIMEOUT)
        raw(api.create_namespaced_config_map, ns, configmap("c", v="1"))
        wait_for(lambda: seen.names() == ["c"], "the event of c")
    old = refl.resource_version
    page = raw(api.list_namespaced_config_map, ns, limit=1)
    raw(api.replace_namespaced_config_map, "a", ns, {**a, "data": {"v": "2"}})
    raw(api.delete_namespaced_config_map, "b", ns)
    raw(api.create_namespaced_config_map, ns, configmap("d", v="1"))
    backend.compact()

    # A watch from a compacted version: 200, then one ERROR event, and the stream ends.
    [event] = watch(partial(api.list_namespaced_config_map, ns), old, lambda e: False)
    message = event["object"].pop("message")
    assert event == {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "reason": "Expired",
            "code": 410,
        },
    }
    if backend.name == "stand-in":  # the watch cache's words, as most servers run
        assert message.startswith(f"too old resource version: {old} (")
    else:  # etcd's, through a server without the watch cache
        assert message == "The resourceVersion for the provided watch is too old."

    # A continue token from before the compaction: 410, with a token to go on inconsistently.
    code, body = refused(
        lambda: raw(
            api.list_namespaced_config_map, ns, limit=1, _continue=page["metadata"]["continue"]
        )
    )
    assert (code, token(body["metadata"]["continue"])) == (
        410,
        {"v": "meta.k8s.io/v1", "rv": -1, "start": "a\0"},
    )
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {"continue": body["metadata"]["continue"]},
        "status": "Failure",
        "message": (
            "The provided continue parameter is too old to display a consistent "
            "list result. You can start a new list without the continue "
            "parameter, or use the continue token in this response to retrieve "
            "the remainder of the results. Continuing with the provided token "
            "results in an inconsistent list - objects that were created, "
            "modified, or deleted between the time the first chunk was returned "
            "and now may show up in the list."
        ),
        "reason": "Expired",
        "code": 410,
    }

    # The Reflector resumes from its version, is told 410, lists again: the exact set now.
    with running(refl):
        wait_for(lambda: refl.lists == 2, "the Reflector's second list", timeout=TIMEOUT)
        raw(api.create_namespaced_config_map, ns, configmap("end", v="1"))
        wait_for(lambda: "end" in seen.names(), "the event of end")
    assert seen.replaced == [
        [("a", {"v": "1"}), ("b", {"v": "1"})],
        [("a", {"v": "2"}), ("c", {"v": "1"}), ("d", {"v": "1"})],
    ]
    assert seen.events == [("ADDED", "c", {"v": "1"}), ("ADDED", "end", {"v": "1"})]
    assert (refl.lists, refl.restarts["gone"]) == (2, 1)


# -- Lease conflicts ---------------------------------------------------------------------


def test_lease_writes_conflict_on_a_stale_version_and_an_existing_name(
    backend: Backend, ns: str
) -> None:
    leases = LeaseApi(backend.client, TIMEOUT)
    assert leases.get(ns, "leader") is None
    spec = {
        "holderIdentity": "replica-a",
        "leaseDurationSeconds": 15,
        "acquireTime": "2024-05-01T10:00:00.123456Z",
        "renewTime": "2024-05-01T10:00:00.123456Z",
        "leaseTransitions": 0,
    }
    body = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "leader", "namespace": ns},
        "spec": spec,
    }
    created = leases.create(ns, body)
    assert (created["kind"], created["apiVersion"], created["spec"]) == (
        "Lease",
        "coordination.k8s.io/v1",
        spec,
    )
    assert leases.get(ns, "leader") == created

    renewed = leases.replace(
        ns, "leader", {**created, "spec": {**spec, "renewTime": "2024-05-01T10:00:02.000001Z"}}
    )
    assert rv(renewed) > rv(created)
    assert renewed["spec"]["renewTime"] == "2024-05-01T10:00:02.000001Z"

    what = {"name": "leader", "group": "coordination.k8s.io", "kind": "leases"}
    stale = {**created, "spec": {**spec, "holderIdentity": "replica-b"}}
    assert refused(lambda: leases.replace(ns, "leader", stale)) == (
        409,
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": 'Operation cannot be fulfilled on leases.coordination.k8s.io "leader": the '
            "object has been modified; please apply your changes to the latest version "
            "and try again",
            "reason": "Conflict",
            "details": what,
            "code": 409,
        },
    )
    assert refused(lambda: leases.create(ns, body)) == (
        409,
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": 'leases.coordination.k8s.io "leader" already exists',
            "reason": "AlreadyExists",
            "details": what,
            "code": 409,
        },
    )
    # an update must name the version it replaces
    blind = {**stale, "metadata": {"name": "leader", "namespace": ns}}
    why = "Invalid value: 0x0: must be specified for an update"
    assert refused(lambda: leases.replace(ns, "leader", blind)) == (
        422,
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f'leases.coordination.k8s.io "leader" is invalid: metadata.resourceVersion: '
            f"{why}",
            "reason": "Invalid",
            "details": {
                **what,
                "causes": [
                    {
                        "reason": "FieldValueInvalid",
                        "message": why,
                        "field": "metadata.resourceVersion",
                    }
                ],
            },
            "code": 422,
        },
    )
    assert leases.get(ns, "leader") == renewed


def test_a_lease_keeps_micro_times_in_utc_and_refuses_others(backend: Backend, ns: str) -> None:
    leases = f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
    code, made = backend.request(
        "POST",
        leases,
        {"metadata": {"name": "zoned"}, "spec": {"renewTime": "2024-05-01T12:00:00.123456+02:00"}},
    )
    assert (code, made["spec"]) == (201, {"renewTime": "2024-05-01T10:00:00.123456Z"})
    # RFC 3339 without six decimals is no MicroTime: kubernetes 37's models write a
    # datetime so when its microsecond is 0 (datetime.isoformat() leaves ".000000" out)
    code, why = backend.request(
        "POST",
        leases,
        {"metadata": {"name": "whole"}, "spec": {"renewTime": "2024-05-01T10:00:00+00:00"}},
    )
    assert (code, why["reason"]) == (400, "BadRequest")
    assert why["message"].startswith('Lease in version "v1" cannot be handled as a Lease: ')
    assert (
        'parsing time "2024-05-01T10:00:00+00:00" as "2006-01-02T15:04:05.000000Z07:00"'
        in (why["message"])
    )


# -- finalizers and deletionTimestamp ------------------------------------------------------


def test_a_finalizer_holds_a_deleted_job_until_the_recorder_takes_it_off(
    backend: Backend, ns: str
) -> None:
    from kubernetes import client

    batch = client.BatchV1Api(backend.client)
    api = DynamicApi(backend.client, TIMEOUT)
    kind = api.kind("batch/v1", "Job")
    assert kind == Kind("batch", "v1", "jobs")
    uid = raw(batch.create_namespaced_job, ns, job("train"))["metadata"]["uid"]
    assert change_finalizer(api, kind, ns, "train", uid, add=True) == "ok"
    held = api.get(kind, ns, "train")
    assert held["metadata"]["finalizers"] == [lc.FINALIZER]
    assert "deletionTimestamp" not in held["metadata"]

    # Background: the default for batch/v1 Jobs orphans, which puts on an "orphan"
    # finalizer that only the garbage collector (not run here) takes off.
    delete = partial(raw, batch.delete_namespaced_job, "train", ns, propagation_policy="Background")
    deleting = delete()
    meta = deleting["metadata"]
    assert (deleting["kind"], meta["finalizers"], meta["deletionGracePeriodSeconds"]) == (
        "Job",
        [lc.FINALIZER],
        0,
    )
    assert meta["deletionTimestamp"] and rv(deleting) > rv(held)
    assert api.get(kind, ns, "train") == deleting  # still there, being deleted
    assert delete() == deleting  # deleting again changes nothing

    # No finalizer may be added now: change_finalizer does not try, a patch is refused.
    assert change_finalizer(api, kind, ns, "train", uid, add=True) == "unchanged"
    why = (
        "Forbidden: no new finalizers can be added if the object is being deleted, found "
        'new finalizers []string{"example.com/other"}'
    )
    cause = {"reason": "FieldValueForbidden", "message": why, "field": "metadata.finalizers"}
    fins = {"metadata": {"finalizers": [lc.FINALIZER, "example.com/other"]}}
    assert refused(lambda: api.patch(kind, ns, "train", fins)) == (
        422,
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f'Job.batch "train" is invalid: metadata.finalizers: {why}',
            "reason": "Invalid",
            "details": {
                "name": "train",
                "group": "batch",
                "kind": "Job",
                "causes": [cause, cause],
            },  # sic: 1.20 validates the update twice
            "code": 422,
        },
    )

    # The recorder's finalizer off: the Job is gone.
    assert change_finalizer(api, kind, ns, "train", uid, add=False) == "ok"
    assert refused(lambda: api.get(kind, ns, "train")) == (
        404,
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": 'jobs.batch "train" not found',
            "reason": "NotFound",
            "details": {"name": "train", "group": "batch", "kind": "jobs"},
            "code": 404,
        },
    )
    assert change_finalizer(api, kind, ns, "train", uid, add=False) == "gone"

    # A watch saw the deletionTimestamp come (MODIFIED), then the Job go (DELETED) with its
    # last stored state: the finalizer still on, at the deletion's own version.
    events = watch(
        partial(batch.list_namespaced_job, ns), str(rv(held)), lambda e: e["type"] == "DELETED"
    )
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("MODIFIED", "train"),
        ("DELETED", "train"),
    ]
    assert events[0]["object"] == deleting
    gone = events[1]["object"]
    assert rv(gone) > rv(deleting)
    assert {**gone, "metadata": {**gone["metadata"], "resourceVersion": ""}} == {
        **deleting,
        "metadata": {**meta, "resourceVersion": ""},
    }

    # A Job with no finalizer goes at once: the DELETE answers a Status, not the Job.
    plain = raw(batch.create_namespaced_job, ns, job("plain"))["metadata"]["uid"]
    assert raw(batch.delete_namespaced_job, "plain", ns, propagation_policy="Background") == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": "plain", "group": "batch", "kind": "jobs", "uid": plain},
    }
