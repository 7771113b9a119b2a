"""Who may report on the collector port (grpc.auth): an agent's ServiceAccount token, reviewed
by the API server of the cluster the stream says it is from, bound to a pod that runs on
the node it reports for; or a line of grpc.auth.tokens_file naming that node."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lens_ebpf.k8s.client import own_namespace
from lens_ebpf.k8s.tokenreview import UNAUTHENTICATED, TokenReviewer, Verdict
from lens_ebpf.protocol.stream_auth import Claim, CollectorAuthConfig, Guard


def node_guard(
    cfg: CollectorAuthConfig,
    listen: str,
    home: str,
    client_of: Callable[[str], Any],
    timeout: float,
) -> Guard:
    """The collector port's guard; client_of(cluster): that cluster's API client, or None
    (a cluster the service does not follow: its tokens cannot be reviewed here). A bare
    name in grpc.auth.service_accounts is an account of the service's own namespace."""
    allowed = cfg.accounts(own_namespace())

    def verify(token: str, claim: Claim) -> Verdict:
        cluster = claim.cluster or home
        client = client_of(cluster)
        if client is None:
            return Verdict(
                UNAUTHENTICATED,
                f"cluster {cluster!r} is not one this service "
                "follows (or its API is not configured): its tokens cannot be "
                "reviewed",
            )
        reviewer = TokenReviewer(client, cfg.audience, timeout)
        return reviewer.node_pod(token, claim.node, allowed)

    return Guard(
        cfg, listen, "collector", verify if cfg.tokenreview else None, node_bound=True, home=home
    )
