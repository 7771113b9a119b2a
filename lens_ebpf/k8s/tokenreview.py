"""Who a bearer token is, as the API server's TokenReview says, and whether that identity
may do what it asks: a ServiceAccount of an allowed list, and, for a node's reporter, a
pod bound to the token running on that node (as NodeRestriction binds a kubelet to its
node). Blocking calls: the gRPC ports run them on a thread (protocol/stream_auth.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lens_ebpf.k8s.reflector import call_raw, describe

# what the API server adds to a ServiceAccount token bound to a pod (a projected volume's
# token, or TokenRequest's boundObjectRef); 1.20 has both (and no node name: 1.30 does)
POD_NAME = "authentication.kubernetes.io/pod-name"
POD_UID = "authentication.kubernetes.io/pod-uid"
SA_PREFIX = "system:serviceaccount:"

OK, UNAUTHENTICATED, DENIED, UNAVAILABLE = (
    "ok",
    "unauthenticated",
    "permission_denied",
    "unavailable",
)


@dataclass(frozen=True)
class Verdict:
    """ok (identity says who), unauthenticated (no valid token), permission_denied (a
    valid token that may not do this) or unavailable (the API did not answer: try again)."""

    result: str
    why: str = ""
    identity: str = ""


def service_account(username: str) -> str:
    """namespace/name of a ServiceAccount's username; "" for any other user."""
    if not username.startswith(SA_PREFIX):
        return ""
    ns, _, name = username.removeprefix(SA_PREFIX).partition(":")
    return f"{ns}/{name}" if ns and name else ""


class TokenReviewer:
    """TokenReview (and the pod a token is bound to) through one cluster's API client, for
    tokens minted for audience ("" the API server's own)."""

    def __init__(self, api_client: Any, audience: str, timeout: float) -> None:
        from kubernetes import client

        self.auth = client.AuthenticationV1Api(api_client)
        self.core = client.CoreV1Api(api_client)
        self.audience, self.timeout = audience, timeout

    def review(self, token: str) -> tuple[Verdict | None, dict[str, Any]]:
        """(a refusal, {}) or (None, the TokenReview's status.user)."""
        spec: dict[str, Any] = {"token": token}
        if self.audience:
            spec["audiences"] = [self.audience]
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
        try:
            doc = call_raw(self.auth.create_token_review, body, timeout=self.timeout)
        except Exception as exc:  # the API's answer (403: no system:auth-delegator) or none
            return Verdict(UNAVAILABLE, f"TokenReview: {describe(exc)}"), {}
        status = doc.get("status") or {}
        if not status.get("authenticated"):
            why = str(status.get("error") or "not authenticated")[:200]
            aud = f" for audience {self.audience}" if self.audience else ""
            return Verdict(UNAUTHENTICATED, f"the token is not valid{aud}: {why}"), {}
        user = status.get("user") or {}
        return None, user if isinstance(user, dict) else {}

    def account(self, token: str, allowed: list[str]) -> Verdict:
        """ok for a token of one of the allowed ServiceAccounts (namespace/name)."""
        return self._account(token, allowed)[0]

    def _account(self, token: str, allowed: list[str]) -> tuple[Verdict, dict[str, Any]]:
        refused, user = self.review(token)
        if refused is not None:
            return refused, {}
        name = str(user.get("username", ""))
        sa = service_account(name)
        if sa not in allowed:
            return Verdict(
                DENIED,
                f"{name} is not one of the allowed ServiceAccounts "
                f"({', '.join(allowed) or 'none'})",
            ), {}
        return Verdict(OK, identity=sa), user

    def node_pod(self, token: str, node: str, allowed: list[str]) -> Verdict:
        """ok for a token of an allowed ServiceAccount bound to a pod that runs on node."""
        got, user = self._account(token, allowed)
        if got.result != OK:
            return got
        extra = user.get("extra") or {}
        pod, uid = (str(next(iter(extra.get(k) or [""]))) for k in (POD_NAME, POD_UID))
        if not pod:
            return Verdict(
                DENIED,
                f"{got.identity}'s token is bound to no pod (use the " "pod's projected token)",
            )
        ns = got.identity.partition("/")[0]
        try:
            doc = call_raw(self.core.read_namespaced_pod, pod, ns, timeout=self.timeout)
        except Exception as exc:
            if getattr(exc, "status", None) == 404:
                return Verdict(DENIED, f"pod {ns}/{pod} of the token is gone")
            return Verdict(UNAVAILABLE, f"pod {ns}/{pod}: {describe(exc)}")
        meta, spec = doc.get("metadata") or {}, doc.get("spec") or {}
        if uid and meta.get("uid") != uid:
            return Verdict(DENIED, f"pod {ns}/{pod} of the token is gone (another has its name)")
        on = str(spec.get("nodeName") or "")
        if on != node:
            return Verdict(
                DENIED, f"pod {ns}/{pod} runs on node {on or '(none)'!r}, " f"not {node!r}"
            )
        return Verdict(OK, identity=f"{got.identity} (pod {ns}/{pod} on {node})")
