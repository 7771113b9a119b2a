"""The POST routes, at the root and under /v1 and /api: /logs (log shippers),
/prometheus (remote write), and alerts: /alerts/metric (Alertmanager's webhook, VMAlert's
notifier), /api/v2/alerts (Prometheus's alerting with this service as its Alertmanager),
/alerts/webhook (any JSON alert). Each takes the bearer token (ingest/admission.py), is counted
and timed by route, and answers in the cluster API's envelope: meta.code 2000, or 4001
(a bad body), 4010 (no or a wrong token), 4003 (no token, from another site), 4008 (a
body not whole in time), 4013 (too large), 4015 (a Content-Type, encoding or protocol
the route does not take), 5003 (a dependency is down, the write queue is full, or the
service holds as many bodies as it takes: retry). The token, the site and the
Content-Type are judged on the head, before a byte of the body is read.
"""

from __future__ import annotations

import time
from typing import Any

from lens_ebpf.core.routes import (
    Answer,
    Param,
    Request,
    Response,
    Route,
    RouteTable,
    Surface,
    unwanted_type,
)
from lens_ebpf.recorder import inputs
from lens_ebpf.recorder.alerts import ingest
from lens_ebpf.recorder.alerts.model import OWN_LABEL
from lens_ebpf.recorder.api.envelope import (
    Ask,
    Connect,
    Services,
    check,
    code,
    down,
    failure,
)
from lens_ebpf.recorder.api.envelope import answer as encoded
from lens_ebpf.recorder.ingest.admission import Ingest, Outcome
from lens_ebpf.recorder.training.intake import take_logs

# what each route's body may declare: log shippers' JSON, JSON lines and plain lines; remote
# write's protobuf; alerts' JSON
LOGS = (
    "application/json",
    "application/x-ndjson",
    "application/jsonlines",
    "application/json-lines",
    "text/plain",
)
PROTOBUF = ("application/x-protobuf",)

routes = RouteTable()


def answer(status: int, message: str = "OK", data: Any = None) -> Response:
    return encoded(status, {"meta": {"code": code(status), "message": message}, "data": data})


def put(got: Outcome) -> Answer:
    """An outcome as its answer: the envelope, or no body at all for 204."""
    if got.status == 204:
        return 204, "text/plain", b"", got.headers
    status, ctype, body = answer(got.status, got.message, got.data)
    return (status, ctype, body, got.headers) if got.headers else (status, ctype, body)


class Admitted(Surface):
    """handler(ask) -> Outcome, behind the token check, counted and timed by route;
    each route's body bound is its setting (recorder.logs, recorder.remote_write)."""

    params = (Param("cluster", doc="the cluster the body is of: this service's home one " "only"),)

    def __init__(self, app: Services, ingest: Ingest, connect: Connect) -> None:
        self.app, self.ingest, self.connect = app, ingest, connect

    def max_body(self, route: Route) -> int:
        cfg = self.app.cfg
        return {"logs": cfg.logs.max_body_bytes, "prometheus": cfg.remote_write.max_body_bytes}.get(
            route.path, cfg.alerts.max_body_bytes
        )

    def admit(self, route: Route, head: Request) -> Answer | None:
        """The token and the site (Ingest.refused), then the Content-Type, on the head."""
        name = "/" + route.path
        got = self.ingest.refused(name, head.headers)
        if got is None and (why := unwanted_type(route, head.headers)) is not None:
            got = Outcome(415, f"{name}: {why}")
        if got is None:
            return None
        self.ingest.count(name, got.status, 0.0)
        return put(got)

    def refuse(self, route: Route, status: int, message: str) -> Answer:
        self.ingest.count("/" + route.path, status, 0.0)
        return put(Outcome(status, f"/{route.path}: {message}"))

    def not_allowed(self, req: Request, method: str, allowed: list[str]) -> Answer:
        said = ", ".join(allowed) or "nothing"
        return put(Outcome(405, f"{method} /{req.path}: not served here ({said} is)"))

    def call(self, route: Route, req: Request) -> Answer:
        name = "/" + route.path  # admitted on its head (admit)
        start = time.perf_counter()
        got = self.ingest.elsewhere(name, req.query.get("cluster", "")) or self._handle(route, req)
        self.ingest.count(name, got.status, time.perf_counter() - start)
        return put(got)

    def _handle(self, route: Route, req: Request) -> Outcome:
        """The route's outcome; a bad parameter 400, the database down 503 (its outage
        logged once), as the cluster API answers them: never the driver's words."""
        ask = Ask(req, self.app, None, self.connect, self)
        try:
            inputs.parameters(req.params, req.query)
            check(self.declared(route), req)
            got: Outcome = route.handler(ask)
            return got
        except Exception as exc:
            e = failure(exc)
            if e is None:
                raise
            if down(exc):
                self.app.outage.failed(exc)
            return Outcome(
                e.status, e.message, headers={"Retry-After": "5"} if e.status == 503 else {}
            )
        finally:
            ask.close()


@routes.post(
    "logs",
    Param("namespace", doc="plain lines' pod's namespace"),
    Param("pod", doc="plain lines' pod"),
    Param("container", doc="plain lines' container"),
    Param("pod_uid", doc="plain lines' pod's uid"),
    takes=LOGS,
)
def logs(ask: Ask) -> Outcome:
    """Log shippers' lines (JSON, JSON lines, plain lines): training progress and the log
    alert rules. Taken here, or (with replicas, on one that does not lead) handed to the leader,
    which keeps the training progress (ingest/leadership.py)."""
    req, app = ask.req, ask.app
    if app.leadership is not None and not app.leadership.leads():
        return app.leadership.forward("logs", req.body, req.headers, req.query)
    also = app.alerts.lines if app.alerts is not None else None  # the log rules
    return take_logs(
        app.training,
        app.writer,
        req.body,
        req.headers.get("content-encoding", ""),
        req.query,
        app.cfg.logs.max_body_bytes,
        app.clock(),
        also,
    )


@routes.post("prometheus", takes=PROTOBUF)
def prometheus(ask: Ask) -> Outcome:
    """Prometheus remote write (1.0 and 2.0) in: copies of the workloads' series, with
    their pods and workloads, written on to recorder.remote_write.url."""
    return ask.app.remote_write.post(ask.req.headers, ask.req.body)


def _alerts(ask: Ask, source: str) -> Outcome:
    """A body of alerts stored (before the answer): 200 {received, new, resolved, ...}."""
    req, app = ask.req, ask.app
    if app.alerts is None:
        return Outcome(503, "alerts are not set up in this service")
    now, home = app.clock(), app.cfg.cluster_name
    refused: list[str] = []
    doc = inputs.loads(req.body)  # BadRequest: 400, as failure() answers it
    if source == "webhook":
        alerts = [ingest.parse_generic(doc, home, now)]
    else:
        alerts, refused = ingest.parse_alertmanager(doc, home, now)
    # ours, sent to Alertmanager and routed back here: stored already, under their own id
    theirs = [a for a in alerts if OWN_LABEL not in a.labels]
    data: dict[str, Any] = dict(app.alerts.take(theirs, source))
    app.outage.answered()
    data["received"], data["own"] = len(alerts) + len(refused), len(alerts) - len(theirs)
    app.alerts.count(source, {"own": data["own"], "refused": len(refused)})
    if source == "webhook" and alerts:
        data["alert_id"] = alerts[0].id
    if refused:  # the others stored: a 400 (not sent again) that names what was not
        data["refused"] = refused
        return Outcome(
            400,
            f"{len(refused)} of {data['received']} alerts refused, the others "
            f"stored: {'; '.join(refused)[:1000]}",
            data,
        )
    return Outcome(200, "OK", data)


@routes.post("alerts/metric")
def alerts_metric(ask: Ask) -> Outcome:
    """Alertmanager's webhook_config body (and VMAlert's notifier's)."""
    return _alerts(ask, "metric")


@routes.post("api/v2/alerts")
def alerts_v2(ask: Ask) -> Outcome:
    """A list of postable alerts, as Prometheus posts them to an Alertmanager."""
    return _alerts(ask, "metric")


@routes.post("alerts/webhook")
def alerts_webhook(ask: Ask) -> Outcome:
    """{alert_name, severity, status, labels, annotations, starts_at, ends_at, id}."""
    return _alerts(ask, "webhook")
