"""The Primus-Lens API's types (issue 70): an unserved method on a served path answers 405
in the envelope."""

from __future__ import annotations

from typing import Any

import pytest
import requests

from tests.conftest import hang_guard


@pytest.mark.parametrize("method, path", [
    ("POST", "perfetto/sessions"), ("POST", "pyspy/tasks"), ("DELETE", "nodes/gpu-1"),
    ("PUT", "clusters/overview"), ("OPTIONS", "alerts")])  # fmt: skip
def test_an_unserved_method_answers_405_in_the_envelope(
        recorder_app: Any, tmp_path: Any, method: str, path: str) -> None:  # fmt: skip
    app = recorder_app(f"sqlite:///{tmp_path / 'r.db'}")
    for prefix in ("/v1", "/lens/v1", "/api"):
        r = requests.request(method, f"http://127.0.0.1:{app.http.port}{prefix}/{path}",
                             json={}, timeout=hang_guard(5))  # fmt: skip
        body = r.json()
        assert r.status_code == 405 and set(body) == {"meta", "data"}, body
        assert body["data"] is None and body["meta"]["code"] == 4016
        assert f"{method} /{path}" in body["meta"]["message"]
        assert r.headers["Allow"] == "GET"
