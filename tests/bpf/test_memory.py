"""After the programs load, the agent gives the BPF compiler's pages back (agent/memory.py):
in a process of its own (a clean RSS), tcp_flows compiled and loaded, the compiler's
libraries' clean pages and the heap's free ones released, and a second compile and load
still working (the pages come back from the page cache)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import EMULATED, hang_guard

# what is measured is the compiler's user-space pages (madvise, the page cache): the same on
# every kernel, and two compiles take minutes under the kernel matrix's emulated CPU
pytestmark = [
    pytest.mark.bpf,
    pytest.mark.skipif(EMULATED, reason="user-space memory, the same on every kernel: host only"),
]
ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, sys
from lens_ebpf.agent import config, kernel_headers
from lens_ebpf.agent.bpf.loader import BpfLoader
from lens_ebpf.agent.events import EventBus
from lens_ebpf.agent.memory import clean_compiler_mappings, release_compiler_memory
from lens_ebpf.agent.metrics.cache import MetricCache
from lens_ebpf.agent.net.policy import load_policy
from lens_ebpf.agent.tcp.tcp_flows import TcpFlows

def rss():
    return {k: int(v.split()[0]) * 1024 for k, v in (l.split(":", 1) for l in
            open("/proc/self/status")) if k in ("VmRSS", "RssAnon", "RssFile")}

def flows():
    loader = BpfLoader()
    cfg = config.load(None, env={})
    f = TcpFlows(cfg.bpf, cfg.events, MetricCache(3600, 1000), EventBus(10), loader)
    assert f.start(load_policy(sys.argv[1])), loader.status
    return f, loader

kernel_headers.resolve(link=True)
first, loader = flows()
before = rss()
left = len(clean_compiler_mappings(open("/proc/self/smaps").read()))
freed = release_compiler_memory()
after = rss()
again = len(clean_compiler_mappings(open("/proc/self/smaps").read()))
second, loader2 = flows()  # compiled again after the release
loader.close()
loader2.close()
print(json.dumps({"before": before, "after": after, "freed": freed, "mappings": left,
                  "left_after": again}))
"""


def test_the_compilers_pages_go_back_and_a_later_compile_still_works(
    policy_file: Path,
) -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(policy_file)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=hang_guard(240),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["mappings"] > 0 and got["freed"] > 20 << 20, got  # LLVM, clang: tens of MB
    # what the release let go left the process's resident pages
    assert got["before"]["RssFile"] - got["after"]["RssFile"] >= got["freed"] * 0.9, got
    assert got["after"]["VmRSS"] < got["before"]["VmRSS"] - (20 << 20), got
