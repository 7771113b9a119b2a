"""The deep dive's latency through a real agent (no BPF) against Python ranks in containerd
containers (tests/deepdivelab.py): a pod's ProcessTree, a py-spy dump of its main process
(what a stall capture costs per rank), and N ranks' dumps at once (what a stall of an
N-rank workload on one node costs), each repeated and the median and the slowest printed.
Needs root, containerd, runc, busybox and py-spy (scripts/setup.sh test).

    .venv/bin/python -m bench.deepdive [--ranks 8] [--repeat 10]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from lens_ebpf.protocol.gen import deepdive_pb2 as pb
from lens_ebpf.protocol.gen import deepdive_pb2_grpc
from tests.deepdivelab import RECORDER_TOKEN, agent_for, containerd_with_python, start_rank

AUTH = (("authorization", f"Bearer {RECORDER_TOKEN}"),)


def timed(call: Callable[[], Any], repeat: int) -> tuple[float, float]:
    """(median, slowest) seconds of repeat calls."""
    took = []
    for _ in range(repeat):
        t = time.perf_counter()
        call()
        took.append(time.perf_counter() - t)
    return statistics.median(took), max(took)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=10)
    a = ap.parse_args()
    lab = containerd_with_python("bench-dd-")
    ctd = next(lab)
    ranks = [start_rank(ctd, f"rank-{i}", "barrier") for i in range(a.ranks)]
    with tempfile.TemporaryDirectory() as tmp:
        agent, address = agent_for(ctd, Path(tmp))
        try:
            with grpc.insecure_channel(address) as ch:
                stub = deepdive_pb2_grpc.DeepDiveServiceStub(ch)
                r0 = ranks[0]

                def tree() -> Any:
                    return stub.ProcessTree(
                        pb.ProcessTreeRequest(pod_uid=r0.pod_uid), metadata=AUTH
                    )

                def dump(r: Any = r0) -> Any:
                    return stub.PySpy(
                        pb.PySpyRequest(pod_uid=r.pod_uid, pid=r.pid, action="dump"), metadata=AUTH
                    )

                def all_dumps() -> None:
                    with concurrent.futures.ThreadPoolExecutor(len(ranks)) as ex:
                        list(ex.map(dump, ranks))

                tree()  # the channel up
                for name, call in (
                    ("ProcessTree, one pod (3 processes)", tree),
                    ("PySpy dump, one rank", dump),
                    (f"PySpy dump, {len(ranks)} ranks at once", all_dumps),
                ):
                    med, worst = timed(call, a.repeat)
                    print(
                        f"{name}: median {med * 1000:.0f} ms, slowest {worst * 1000:.0f} ms "
                        f"({a.repeat} times)"
                    )
        finally:
            agent.stop()
            for r in ranks:
                ctd.remove(r.cid)
            next(lab, None)  # containerd stopped


if __name__ == "__main__":
    main()
