"""A Subscribe client for the bench: counts the events it receives until SIGTERM, then
prints `events=N flows=M` (flows: flow_closed events to the given remote address);
--batch: through SubscribeBatch (several events to a message).

    python -m bench.subscriber [--batch] HOST:PORT RADDR [KIND...]
"""

from __future__ import annotations

import signal
import sys
import threading

import grpc

from lens_ebpf.protocol.gen import lens_pb2 as pb
from lens_ebpf.protocol.gen import lens_pb2_grpc


def main(addr: str, raddr: str, kinds: list[str], batch: bool = False) -> int:
    stub = lens_pb2_grpc.EventServiceStub(grpc.insecure_channel(addr))
    req = pb.SubscribeRequest(kinds=kinds)
    stream = stub.SubscribeBatch(req) if batch else stub.Subscribe(req)
    done = threading.Event()

    def stop(*_: object) -> None:
        done.set()
        stream.cancel()

    signal.signal(signal.SIGTERM, stop)
    events = flows = 0
    print("subscribed", flush=True)
    try:
        for msg in stream:
            for ev in msg.events if batch else (msg,):
                events += 1
                if ev.WhichOneof("payload") == "flow_closed" and ev.flow_closed.raddr == raddr:
                    flows += 1
    except grpc.RpcError:
        if not done.is_set():
            raise
    print(f"events={events} flows={flows}", flush=True)
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    batched = "--batch" in args
    args = [a for a in args if a != "--batch"]
    sys.exit(main(args[0], args[1], args[2:], batched))
