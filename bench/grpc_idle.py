"""Health check and GetNode latency with N idle Subscribe streams open.

.venv/bin/python -m bench.grpc_idle [N]
"""

from __future__ import annotations

import statistics
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lens_ebpf.protocol.gen import lens_pb2 as pb
from lens_ebpf.protocol.gen import lens_pb2_grpc
from tests.agentproc import AgentProc, free_port


def main(n: int) -> None:
    port = free_port()
    agent = AgentProc(
        "--no-collector.tcp",
        "--no-collector.processes",
        env={"LENS_GRPC__LISTEN": f"127.0.0.1:{port}"},
    )
    try:
        agent.wait_ready()
        addr = f"127.0.0.1:{port}"
        stub = lens_pb2_grpc.EventServiceStub(grpc.insecure_channel(addr))
        streams = [stub.Subscribe(pb.SubscribeRequest(kinds=["oom_kill"])) for _ in range(n)]
        deadline = time.monotonic() + 60
        while agent.sample("lens_agent_grpc_streams") != n and time.monotonic() < deadline:
            time.sleep(0.1)
        health = health_pb2_grpc.HealthStub(grpc.insecure_channel(addr))
        node = lens_pb2_grpc.NodeServiceStub(grpc.insecure_channel(addr))
        for name, call in (
            ("health Check", lambda: health.Check(health_pb2.HealthCheckRequest(), timeout=5)),
            ("GetNode", lambda: node.GetNode(pb.GetNodeRequest(), timeout=5)),
        ):
            ms = []
            for _ in range(50):
                t0 = time.perf_counter()
                call()
                ms.append((time.perf_counter() - t0) * 1000)
            print(
                f"{name} with {agent.sample('lens_agent_grpc_streams'):.0f} idle streams: "
                f"median {statistics.median(ms):.1f} ms, max {max(ms):.1f} ms"
            )
        for st in streams:
            st.cancel()
    finally:
        agent.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 500)
