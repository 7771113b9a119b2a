"""What a notification channel's config holds that is a credential, and how it is shown:
`<secret>` in every read (as Alertmanager shows its config's secrets), never the value,
and kept on an update that sends `<secret>` back (the page's edit form sends the whole
config it was shown).

A credential: a key whose name says so (password, secret, token, key, credential,
auth), every header's value but Content-Type's, Accept's and User-Agent's (Authorization,
an API key, a signature: a header is mostly there to carry one), a URL's userinfo and
query values, and the whole path of a `webhook_url` (a Slack or DingTalk robot's URL is
its token)."""

from __future__ import annotations

import base64
import re
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from lens_ebpf.recorder.errors import BadRequest

SECRET = "<secret>"
SECRET_KEY = re.compile(r"pass|secret|token|key|credential|auth", re.IGNORECASE)
HEADERS = ("headers", "http_headers")
PLAIN_HEADERS = ("content-type", "accept", "user-agent")
WHOLE_PATH = ("webhook_url",)  # the URL is the credential: only its scheme and host shown


def url(text: str, whole_path: bool = False) -> str:
    """A URL as it is shown: userinfo and query values `<secret>` (whole_path: the path
    and query too); the scheme, host and port as they are."""
    try:
        u = urlsplit(text)
        host = u.hostname or ""
        port = f":{u.port}" if u.port else ""
    except ValueError:
        return SECRET
    if not u.scheme or not u.netloc:
        return text if "@" not in text and "?" not in text else SECRET
    netloc = (
        (f"{SECRET}@" if "@" in u.netloc else "") + (f"[{host}]" if ":" in host else host) + port
    )
    if whole_path:
        rest = "/" + SECRET if u.path.strip("/") or u.query else u.path
        return urlunsplit((u.scheme, netloc, rest, "", ""))
    query = urlencode(
        [(k, SECRET) for k, _ in parse_qsl(u.query, keep_blank_values=True)], safe="<>"
    )
    return urlunsplit((u.scheme, netloc, u.path, query, u.fragment))


def userinfo(text: str) -> tuple[str, str]:
    """A URL without its userinfo, and the Basic Authorization header value that stands
    for it ("" for none): what is sent, so the credential never rides in the URL (where
    a client library's error would quote it)."""
    try:
        u = urlsplit(text)
    except ValueError:
        return text, ""
    if "@" not in u.netloc:
        return text, ""
    who, _, where = u.netloc.rpartition("@")
    user, _, password = who.partition(":")
    token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()
    return urlunsplit((u.scheme, where, u.path, u.query, u.fragment)), f"Basic {token}"


def _header(name: str, value: Any) -> Any:
    return value if str(name).lower() in PLAIN_HEADERS or value in (None, "") else SECRET


def shown(config: Any) -> Any:
    """A channel's config as every read shows it."""
    if not isinstance(config, dict):
        return config
    out: dict[str, Any] = {}
    for k, v in config.items():
        if k in HEADERS and isinstance(v, dict):
            out[k] = {h: _header(h, x) for h, x in v.items()}
        elif isinstance(v, dict):
            out[k] = shown(v)
        elif SECRET_KEY.search(str(k)) and v not in (None, "", False, 0):
            out[k] = SECRET
        elif isinstance(v, str) and str(k).endswith("url"):
            out[k] = url(v, k in WHOLE_PATH)
        else:
            out[k] = v
    return out


def kept(new: Any, old: Any, where: str = "config") -> Any:
    """new (an update's config) with each `<secret>` it sends back (a value shown as one,
    or a URL as it was shown) made the stored value again; BadRequest naming the field
    where `<secret>` stands for nothing stored."""
    if not isinstance(new, dict):
        return new
    old = old if isinstance(old, dict) else {}
    out: dict[str, Any] = {}
    for k, v in new.items():
        was = old.get(k)
        if isinstance(v, dict):
            if k in HEADERS:
                was = was if isinstance(was, dict) else {}
                out[k] = {
                    h: _restored(x, was.get(h), _header(h, was.get(h)), f"{where}.{k}.{h}")
                    for h, x in v.items()
                }
            else:
                out[k] = kept(v, was, f"{where}.{k}")
            continue
        showing = (
            url(was, k in WHOLE_PATH) if isinstance(was, str) and str(k).endswith("url") else SECRET
        )
        out[k] = _restored(v, was, showing, f"{where}.{k}")
    return out


def _restored(value: Any, was: Any, showing: Any, field: str) -> Any:
    if not isinstance(value, str) or SECRET not in value:
        return value
    if was is not None and value == showing:
        return was
    raise BadRequest(
        f"{field}: {SECRET} stands for the stored value, and {value!r} is not "
        "what was shown of one: send the whole value"
    )
