import ipaddress
import random
from pathlib import Path

import pytest

from lens_ebpf.agent.net.policy import (
    CLASS_IDS,
    CLASS_NAMES,
    PolicyError,
    abnormal,
    classify,
    load_policy,
    lpm_entries,
    parse_policy,
)

POLICY = """
k8sPod: [10.244.0.0/16, "fd10::/64"]
k8s_svc: [10.96.0.0/12]
dns: [10.96.0.10, 8.8.8.8]
docker: [172.17.0.0/16]
localhost: [127.0.0.0/8, "::1"]
internal_hosts: [10.0.0.0/8, 192.168.0.0/16, "fd00::/8"]
abnormalBlackList: [203.0.113.0/24]
abnormalWhiteList: [203.0.113.5]
"""


@pytest.fixture
def policy():
    return parse_policy(POLICY, "test.yaml")


@pytest.mark.parametrize(
    ("addr", "cls"),
    [
        ("10.244.3.4", "k8sPod"),
        ("10.96.0.1", "k8sSvc"),
        ("10.96.0.10", "k8sSvc"),  # k8sSvc comes before dns
        ("8.8.8.8", "dns"),
        ("172.17.0.2", "docker"),
        ("127.0.0.1", "localhost"),
        ("::1", "localhost"),
        ("10.1.2.3", "internalHosts"),
        ("192.168.1.1", "internalHosts"),
        ("fd10::5", "k8sPod"),
        ("fd00:1::5", "internalHosts"),
        ("1.1.1.1", "externalHosts"),
        ("2001:db8::1", "externalHosts"),
        ("::ffff:10.244.0.9", "k8sPod"),
    ],
)
def test_first_match_order(policy, addr: str, cls: str) -> None:
    assert classify(policy, addr) == cls


def test_snake_case_and_bare_addresses(policy) -> None:
    assert policy.classes["k8sSvc"] == (ipaddress.ip_network("10.96.0.0/12"),)
    assert ipaddress.ip_network("10.96.0.10/32") in policy.classes["dns"]


def simulate_lpm(entries: dict, addr: str) -> int:
    ip = ipaddress.ip_address(addr)
    value = (0xFFFF << 32 | int(ip)) if ip.version == 4 else int(ip)
    best = None
    for (plen, raw), cls in entries.items():
        net = int.from_bytes(raw, "big")
        hit = plen == 0 or (value >> (128 - plen)) == (net >> (128 - plen))
        if hit and (best is None or plen > best[0]):
            best = (plen, cls)
    return best[1] if best else CLASS_IDS["externalHosts"]


def test_lpm_entries_give_the_first_match_class(policy) -> None:
    entries = lpm_entries(policy)
    rng = random.Random(7)
    probes = ["10.96.0.10", "10.244.9.9", "10.5.5.5", "8.8.8.8", "::1", "fd10::1", "fd00::1"]
    for _ in range(2000):
        probes.append(
            str(
                ipaddress.IPv4Address(rng.choice([0x0A000000, 0x0A600000, 0]) + rng.getrandbits(24))
            )
        )
    for addr in probes:
        assert CLASS_NAMES[simulate_lpm(entries, addr)] == classify(policy, addr), addr


def test_ipv4_prefixes_are_mapped(policy) -> None:
    entries = lpm_entries(policy)
    key = (96 + 16, bytes(10) + b"\xff\xff" + bytes([10, 244, 0, 0]))
    assert entries[key] == CLASS_IDS["k8sPod"]
    # the dns /32 inside the service range carries the service class
    dns_key = (128, bytes(10) + b"\xff\xff" + bytes([10, 96, 0, 10]))
    assert entries[dns_key] == CLASS_IDS["k8sSvc"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "k8sPod: [10.244.0.0/33]\n",
            "bad.yaml: k8sPod: '10.244.0.0/33' is not a CIDR or an IP address",
        ),
        ("internal_hosts: [not-an-ip]\n", "bad.yaml: internal_hosts: 'not-an-ip' is not a CIDR"),
        ("k8sPod: {a: 1}\n", "bad.yaml: k8sPod: expected a list of CIDRs"),
        ("pods: [10.0.0.0/8]\n", "bad.yaml: unknown key 'pods'"),
        ("k8sPod: [\n", "bad.yaml: not valid YAML at line"),
        ("- 10.0.0.0/8\n", "bad.yaml: top level must be a mapping"),
    ],
)
def test_bad_policy_names_file_key_and_value(text: str, message: str) -> None:
    with pytest.raises(PolicyError) as err:
        parse_policy(text, "bad.yaml")
    assert message in str(err.value)


def test_empty_policy_is_all_external() -> None:
    p = parse_policy("{}\n", "empty.yaml")  # said explicitly: no classes
    assert classify(p, "10.0.0.1") == "externalHosts"
    assert lpm_entries(p) == {}


@pytest.mark.parametrize("text", ["", "\n", "# internalHosts: [10.0.0.0/8]\n"])
def test_an_empty_file_is_refused(text: str) -> None:
    """An empty file would reclassify everything as externalHosts: say so instead."""
    with pytest.raises(PolicyError, match="empty.yaml: empty; write {} for a policy"):
        parse_policy(text, "empty.yaml")


def test_a_policy_over_the_trie_is_refused_before_any_work() -> None:
    text = "internalHosts:\n" + "".join(
        f"  - 10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}\n" for i in range(100_000)
    )
    with pytest.raises(PolicyError, match="big.yaml: 100000 class prefixes; at most 4096"):
        parse_policy(text, "big.yaml")


def test_trie_entries_match_first_match_classification_at_the_limit() -> None:
    """4,096 nested and overlapping prefixes: the longest match answers as first-match
    classification does (compile time: bench/policy_compile.py)."""
    rng = random.Random(7)
    lines = {name: [] for name in ("k8sPod", "dns", "internalHosts", "docker")}
    for _ in range(4096):
        plen = rng.choice((8, 12, 16, 20, 24, 28, 32))
        addr = f"10.{rng.randrange(4)}.{rng.randrange(256)}.{rng.randrange(256)}/{plen}"
        lines[rng.choice(list(lines))].append(addr)
    text = "".join(f"{k}: [{', '.join(v)}]\n" for k, v in lines.items())
    p = parse_policy(text, "big.yaml")
    entries = lpm_entries(p)
    names = {v: k for k, v in CLASS_IDS.items()}
    nets = [
        (ipaddress.ip_network((int.from_bytes(raw, "big") & 0xFFFFFFFF, plen - 96)), cls)
        for (plen, raw), cls in entries.items()
    ]
    for _ in range(2000):  # what one LPM lookup answers is what first-match classification says
        ip = ipaddress.ip_address(
            f"10.{rng.randrange(4)}.{rng.randrange(256)}.{rng.randrange(256)}"
        )
        hits = [(n.prefixlen, cls) for n, cls in nets if ip in n]
        want = classify(p, str(ip))
        assert (names[max(hits)[1]] if hits else "externalHosts") == want, ip


def test_abnormal_lists(policy) -> None:
    assert abnormal(policy, "203.0.113.9")
    assert not abnormal(policy, "203.0.113.5")
    assert not abnormal(policy, "1.1.1.1")


def test_shipped_policy_parses() -> None:
    from importlib import resources

    path = Path(str(resources.files("lens_ebpf.agent.net").joinpath("policy.yaml")))
    p = load_policy(path)
    assert classify(p, "127.0.0.1") == "localhost"
    assert classify(p, "10.244.1.1") == "k8sPod"


def test_unreadable_policy(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy(tmp_path / "missing.yaml")


def test_cluster_networks_fill_only_empty_classes() -> None:
    from lens_ebpf.agent.net.policy import with_cluster_networks

    pods = [ipaddress.ip_network("10.32.0.0/12")]
    svcs = [ipaddress.ip_network("10.112.0.0/12")]
    empty = parse_policy("k8sPod: []\ninternalHosts: [10.0.0.0/8]\n")
    merged, filled = with_cluster_networks(empty, pods, svcs)
    assert filled == ["k8sPod", "k8sSvc"]
    assert classify(merged, "10.33.0.1") == "k8sPod"
    assert classify(merged, "10.112.0.10") == "k8sSvc"
    assert classify(merged, "10.200.0.1") == "internalHosts"
    written = parse_policy("k8sPod: [10.244.0.0/16]\n")
    kept, filled = with_cluster_networks(written, pods, svcs)
    assert filled == ["k8sSvc"] and classify(kept, "10.33.0.1") == "externalHosts"
    assert with_cluster_networks(written, [], []) == (written, [])


def test_policy_watcher_publishes_the_effective_policy(tmp_path) -> None:
    from ipaddress import ip_network

    from lens_ebpf.agent.net.policy import classify
    from lens_ebpf.agent.net.policy_watch import ClusterNetworks, PolicyWatcher

    path = tmp_path / "policy.yaml"
    path.write_text("internalHosts: [10.0.0.0/8]\n")
    w = PolicyWatcher(path)
    # CIDRs found before anyone listens are not lost: a new consumer gets them at once
    w.set_cluster_networks(ClusterNetworks((ip_network("10.244.0.0/16"),), (), "kubeadm-config"))
    seen: list = []
    w.subscribe(seen.append)
    assert classify(seen[-1], "10.244.1.1") == "k8sPod" and w.filled() == ["k8sPod"]
    path.write_text("internalHosts: [10.0.0.0/8]\ndns: [10.0.0.53]\n")
    assert w.reload("test") and classify(seen[-1], "10.0.0.53") == "dns"
    assert classify(seen[-1], "10.244.1.1") == "k8sPod"  # the cluster's part stays
    path.write_text("dns: [not-an-address]\n")
    assert not w.reload("test")
    assert w.reloads == {"success": 1, "failure": 1} and "not-an-address" in w.last_error
    assert classify(w.effective(), "10.0.0.53") == "dns"  # the last good one is kept

    def refuse(policy) -> None:
        raise ValueError("policy has 5000 prefixes; at most 4096")

    path.write_text("internalHosts: [10.0.0.0/8]\n")
    w.subscribe(lambda p: None)
    w._consumers.append(refuse)  # a consumer that cannot take the next one
    assert not w.reload("test") and "at most 4096" in w.last_error
