"""Talking to Alertmanager (its API v2: alerts posted, silences created and expired) and
to webhook channels; each call time-bounded, its failure said in one line."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any

from lens_ebpf.recorder.alerts import secrets

# Alertmanager keeps an alert this long after its last post unless told it ended; we post
# firing ones again each notify run, well within it
RESEND = timedelta(minutes=1)
# the longest a receiver is waited for, whatever a channel's own timeout says: the wait
# holds one of the service's worker threads
MOST_SECONDS = 30.0


class SendError(Exception):
    """The receiver refused or did not answer (the message says which and why)."""


def _call(
    method: str,
    url: str,
    body: Any = None,
    timeout: float = 10.0,
    headers: dict[str, str] | None = None,
) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    timeout = min(timeout, MOST_SECONDS)
    target, basic = secrets.userinfo(url)  # user:password@ sent as Basic auth
    sent = {"Content-Type": "application/json", **(headers or {})}
    if basic and not any(k.lower() == "authorization" for k in sent):
        sent["Authorization"] = basic
    req = urllib.request.Request(target, data=data, method=method, headers=sent)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:300].decode(errors="replace")
        raise SendError(f"{method} {secrets.url(url)}: {exc.code} {detail}".strip()) from None
    except (OSError, ValueError) as exc:  # (a URL's credentials never in a message)
        said = str(exc).replace(url, secrets.url(url))
        raise SendError(
            f"{method} {secrets.url(url)}: {type(exc).__name__}: {said}"[:300]
        ) from None
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


def _rfc3339(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class Alertmanager:
    """An Alertmanager's API v2 (recorder.alerts.alertmanager_url); "" none."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url, self.timeout = url.rstrip("/"), timeout

    def post_alerts(self, alerts: list[dict[str, Any]]) -> None:
        """[{labels, annotations, starts_at, ends_at | None, generator_url}] as
        Alertmanager's postable alerts (an alert that ended carries its end)."""
        body = []
        for a in alerts:
            one = {
                "labels": {k: str(v) for k, v in a["labels"].items()},
                "annotations": {k: str(v) for k, v in a["annotations"].items()},
                "startsAt": _rfc3339(a["starts_at"]),
            }
            if a.get("ends_at") is not None:
                one["endsAt"] = _rfc3339(a["ends_at"])
            if a.get("generator_url"):
                one["generatorURL"] = a["generator_url"]
            body.append(one)
        _call("POST", f"{self.url}/api/v2/alerts", body, self.timeout)

    def create_silence(
        self,
        matchers: list[dict[str, Any]],
        starts: datetime,
        ends: datetime,
        created_by: str,
        comment: str,
        silence_id: str = "",
    ) -> str:
        """A silence (updated when silence_id names one of its); its id there."""
        body: dict[str, Any] = {
            "matchers": matchers,
            "startsAt": _rfc3339(starts),
            "endsAt": _rfc3339(ends),
            "createdBy": created_by or "lens-ebpf",
            "comment": comment or "created through lens-ebpf",
        }
        if silence_id:
            body["id"] = silence_id
        got = _call("POST", f"{self.url}/api/v2/silences", body, self.timeout)
        if not isinstance(got, dict) or not got.get("silenceID"):
            raise SendError(
                f"POST {secrets.url(self.url)}/api/v2/silences: no silenceID in " f"{got!r}"[:300]
            )
        return str(got["silenceID"])

    def expire_silence(self, silence_id: str) -> None:
        try:
            _call("DELETE", f"{self.url}/api/v2/silence/{silence_id}", None, self.timeout)
        except SendError as exc:
            if " 404 " not in f"{exc} ":  # gone already (expired, or Alertmanager restarted)
                raise


def webhook(
    url: str,
    payload: dict[str, Any],
    method: str = "POST",
    headers: dict[str, str] | None = None,
    timeout: float = 10.0,
) -> None:
    """A webhook channel's delivery: 2xx or SendError."""
    _call(method, url, payload, timeout, headers)
