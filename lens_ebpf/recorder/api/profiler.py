"""The workload page's "Profiler Files" tab and the pages it opens: the PyTorch profiler
traces the agents find in a workload's containers (recorder/profiler/files.py), the TraceLens
analysis sessions over them and the trace-viewer sessions (recorder/profiler/sessions.py),
in the original's shapes (Lens/modules/api/pkg/api/tracelens and perfetto at dd69b3c)."""

from __future__ import annotations

import mimetypes
import re
import sys
from pathlib import Path
from typing import Any

from lens_ebpf.core.routes import Answer, Param, RouteTable
from lens_ebpf.recorder.api.envelope import Ask, integer
from lens_ebpf.recorder.errors import NotFound, Unavailable
from lens_ebpf.recorder.profiler.files import Profiler
from lens_ebpf.recorder.profiler.sessions import PROFILES, Sessions

routes = RouteTable()
files = RouteTable()  # a trace's bytes, the analysis page, the viewer: not the envelope
SESSION = Param("session_id", required=True)
CREATE = (
    Param("workload_uid", doc="the workload the trace is of", required=True, body=True),
    Param(
        "profiler_file_id",
        "integer",
        "the trace (workloads/{uid}/profiler-files' id)",
        required=True,
        body=True,
    ),
    Param("ttl_minutes", "integer", "minutes the session lives", body=True),
)
EXTEND = Param("extend_minutes", "integer", "minutes more", required=True, body=True)
# the viewer's page: the trace-viewer page opens it with Perfetto's #!/viewer?url=/trace.json;
# speedscope reads #profileURL=, so the hash is turned into that before speedscope loads,
# the URL taken as the session's own (beside the page), with the page's ?cluster=
HASH = """<script>(function(){var h=location.hash,m=h.match(/^#!\\/viewer\\?url=([^&]*)/);
if(!m){return;}var u=decodeURIComponent(m[1]).replace(/^\\/+/,'');
var at=new URL(u,location.href.split('#')[0].split('?')[0]);at.search=location.search;
history.replaceState(null,'',location.pathname+location.search+'#profileURL='+
encodeURIComponent(at.href)+'&title=trace.json');})();</script>"""


def profiler(ask: Ask) -> Profiler:
    if ask.app.profiler is None:
        raise Unavailable("profiler traces are not part of this service")
    return ask.app.profiler


def sessions(ask: Ask) -> Sessions:
    return profiler(ask).sessions


@routes.get("workloads/{uid}/profiler-files")
def profiler_files(ask: Ask) -> Any:
    """The workload's PyTorch profiler traces, newest first: asked of each running pod's
    agent now, with every one found before (id, file name, size, rank, pod, node, path,
    when written, whether its bytes are kept)."""
    got, problems = profiler(ask).listing(ask.c.name, ask.c.tables, ask.arg("uid"))
    if problems:
        from lens_ebpf.recorder import prom

        for p in problems:
            prom.missed(f"traces not listed: {p}")
    return got


@files.get("profiler-files/{id}/download", Param("id", "integer", required=True), tool=False)
def download(ask: Ask) -> Answer:
    """A trace's bytes as the process wrote them (fetched from its agent first where the
    recorder does not keep them)."""
    file_id = integer(ask.req.params, "id")
    r, data = profiler(ask).read(ask.c.name, file_id)
    name = re.sub(r"[^A-Za-z0-9._-]", "_", r.file_name) or f"profiler-file-{file_id}"
    ctype = "application/gzip" if name.endswith(".gz") else "application/json"
    return 200, ctype, data, {"Content-Disposition": f"attachment; filename={name}"}


@routes.get("tracelens/resource-profiles")
def resource_profiles(ask: Ask) -> Any:
    """What an analysis may take: small, medium (the default), large."""
    return {"profiles": PROFILES}


@routes.post(
    "tracelens/sessions",
    *CREATE,
    Param("resource_profile", doc="small, medium or large", body=True),
    Param(
        "profiler_file_ids",
        "array",
        "the other ranks' traces to analyse with it " "(none: those beside it, in its directory)",
        body=True,
    ),
)
def tracelens_create(ask: Ask) -> Any:
    """Starts a TraceLens session over a trace and its sibling ranks: pending, then
    initializing (fetched and analysed by HolisticTraceAnalysis), ready with its ui_path
    and its analysis, or failed saying why."""
    return sessions(ask).create("tracelens", ask.c.name, ask.body())


@routes.get("tracelens/sessions")
def tracelens_list(ask: Ask) -> Any:
    """Every TraceLens session of the cluster not deleted, newest first."""
    return sessions(ask).listing("tracelens", ask.c.name)


@routes.get("tracelens/sessions/{session_id}", SESSION)
def tracelens_get(ask: Ask) -> Any:
    """A TraceLens session: its status (expired once past expires_at), ui_path when ready,
    and its analysis (per rank compute, non-compute and idle time, overlap, kernel
    breakdown, the slowest rank)."""
    return sessions(ask).get("tracelens", ask.c.name, ask.arg("session_id"))


@routes.patch("tracelens/sessions/{session_id}", SESSION, EXTEND)
def tracelens_extend(ask: Ask) -> Any:
    """A TraceLens session's life extended (1..120 minutes)."""
    return sessions(ask).extend("tracelens", ask.c.name, ask.arg("session_id"), ask.body())


@routes.delete("tracelens/sessions/{session_id}", SESSION)
def tracelens_delete(ask: Ask) -> Any:
    """A TraceLens session ended."""
    return sessions(ask).delete("tracelens", ask.c.name, ask.arg("session_id"))


@routes.get("tracelens/workloads/{workload_uid}/sessions")
def tracelens_of_workload(ask: Ask) -> Any:
    """A workload's TraceLens sessions, newest first."""
    return sessions(ask).listing("tracelens", ask.c.name, ask.arg("workload_uid"))


@files.get("tracelens/sessions/{session_id}/ui", SESSION, tool=False)
def tracelens_page(ask: Ask) -> Answer:
    """A ready session's analysis as one self-contained page (the TraceLens page's
    iframe)."""
    page = sessions(ask).page(ask.c.name, ask.arg("session_id"))
    return 200, "text/html; charset=utf-8", page.encode()


@routes.post("perfetto/sessions", *CREATE)
def perfetto_create(ask: Ask) -> Any:
    """Starts a trace-viewer session over a trace: ready once its bytes are fetched, its
    ui_path then a viewer (speedscope) opening it."""
    return sessions(ask).create("perfetto", ask.c.name, ask.body())


@routes.get("perfetto/sessions/{session_id}", SESSION)
def perfetto_get(ask: Ask) -> Any:
    """A trace-viewer session: its status and, when ready, its ui_path."""
    return sessions(ask).get("perfetto", ask.c.name, ask.arg("session_id"))


@routes.patch("perfetto/sessions/{session_id}", SESSION, EXTEND)
def perfetto_extend(ask: Ask) -> Any:
    """A trace-viewer session's life extended (1..60 minutes)."""
    return sessions(ask).extend("perfetto", ask.c.name, ask.arg("session_id"), ask.body())


@routes.delete("perfetto/sessions/{session_id}", SESSION)
def perfetto_delete(ask: Ask) -> Any:
    """A trace-viewer session ended."""
    return sessions(ask).delete("perfetto", ask.c.name, ask.arg("session_id"))


def viewer_dir(ask: Ask) -> Path:
    """speedscope's built files (scripts/setup.sh installs them)."""
    configured = ask.app.cfg.profiler.viewer_dir
    d = Path(configured) if configured else Path(sys.prefix) / "share" / "speedscope"
    if not (d / "index.html").is_file():
        raise Unavailable(
            f"the trace viewer is not installed ({d}: scripts/setup.sh "
            "installs speedscope there)"
        )
    return d


def viewer_names(d: Path) -> frozenset[str]:
    """The viewer's files (a flat directory), without its dot files."""
    return frozenset(p.name for p in d.iterdir() if p.is_file() and not p.name.startswith("."))


@files.get("perfetto/sessions/{session_id}/ui", SESSION, tool=False)
def perfetto_page(ask: Ask) -> Answer:
    """The viewer (speedscope) for a ready session, opening its trace: Perfetto's
    #!/viewer?url=/trace.json taken as speedscope's #profileURL= of the session's
    trace.json."""
    sessions(ask).ready("perfetto", ask.c.name, ask.arg("session_id"))
    page = (viewer_dir(ask) / "index.html").read_text()
    return 200, "text/html; charset=utf-8", page.replace("<head>", "<head>" + HASH, 1).encode()


@files.get(
    "perfetto/sessions/{session_id}/ui/{name}", SESSION, Param("name", required=True), tool=False
)
def perfetto_file(ask: Ask) -> Answer:
    """The session's trace.json (its trace as JSON), or one of the viewer's files."""
    sid, name = ask.arg("session_id"), ask.arg("name")
    if name == "trace.json":
        data = sessions(ask).trace(ask.c.name, sid)
        return 200, "application/json", data
    d = viewer_dir(ask)  # the viewer's own files: static, asked without ?cluster=
    # its files are the names in the directory: nothing else reaches the file system (a
    # name too long for it, a NUL, a path were a 500 where they are simply not there)
    if name not in viewer_names(d):
        raise NotFound(f"no viewer file {name[:80]!r}")
    f = d / name
    ctype = mimetypes.guess_type(name)[0] or "application/octet-stream"
    if name.endswith(".wasm"):
        ctype = "application/wasm"
    return 200, ctype, f.read_bytes(), {"Cache-Control": "max-age=86400"}
