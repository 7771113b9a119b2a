"""Policy costs: refusing an oversized file, and compiling a full one for the kernel trie.

.venv/bin/python -m bench.policy_compile
"""

from __future__ import annotations

import random
import time

from lens_ebpf.agent.net.policy import MAX_PREFIXES, PolicyError, lpm_entries, parse_policy


def lines(n: int, rng: random.Random) -> str:
    out = []
    for _ in range(n):
        plen = rng.choice((8, 12, 16, 20, 24, 28, 32))
        out.append(f"  - 10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(256)}/{plen}")
    return "\n".join(out) + "\n"


def main() -> None:
    rng = random.Random(7)
    big = "internalHosts:\n" + lines(100_000, rng)
    t0 = time.perf_counter()
    try:
        parse_policy(big, "big.yaml")
    except PolicyError as exc:
        refused = str(exc)
    t1 = time.perf_counter()
    print(f"100000-prefix policy refused in {t1 - t0:.3f} s: {refused}")
    classes = ("k8sPod", "k8sSvc", "dns", "docker", "internalHosts")
    full = "".join(f"{c}:\n" + lines(MAX_PREFIXES // len(classes), rng) for c in classes)
    t0 = time.perf_counter()
    policy = parse_policy(full, "full.yaml")
    t1 = time.perf_counter()
    entries = lpm_entries(policy)
    t2 = time.perf_counter()
    print(
        f"{sum(len(v) for v in policy.classes.values())}-prefix policy: parsed in "
        f"{t1 - t0:.3f} s, {len(entries)} trie entries compiled in {t2 - t1:.3f} s"
    )


if __name__ == "__main__":
    main()
