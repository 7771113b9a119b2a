import subprocess
from pathlib import Path

import pytest

from lens_ebpf.agent.devices.rdma import statistic, sysfs
from lens_ebpf.agent.devices.rdma.collector import RdmaCollector
from lens_ebpf.core.exposition import render_metrics
from tests.golden import check_golden

FIX = Path(__file__).parent.parent / "fixtures" / "rdma"
SYS = FIX / "sys"


def by_name(devices: list[sysfs.RdmaDevice]) -> dict[str, sysfs.RdmaDevice]:
    return {d.name: d for d in devices}


def samples(c: RdmaCollector) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value for m in c.snapshot() for s in m.samples
    }


def test_devices_found_by_directory_whatever_their_names() -> None:
    devs = by_name(sysfs.read_devices(SYS))
    assert sorted(devs) == ["iwp1s0f0", "mlx4_0", "mlx5_0", "mlx5_1", "rocep8s0f0"]
    mlx = devs["mlx5_0"]
    assert (mlx.node_guid, mlx.fw_ver, mlx.hca_type, mlx.board_id, mlx.netdev) == (
        "0c42:a103:0065:2a3c",
        "20.31.1014",
        "MT4123",
        "MT_0000000223",
        "ib0",
    )
    p = mlx.ports[0]
    assert (p.state, p.state_name, p.phys_state, p.link_layer) == (4, "ACTIVE", 5, "InfiniBand")
    assert p.rate_bytes == 25e9
    assert p.port_guid == "0c42:a103:0065:2a3c"
    assert p.saturated == ["port_rcv_data"]
    assert "port_rcv_data" not in p.counters
    assert p.counters["port_xmit_data"] == 1234567
    assert p.hw_counters["out_of_buffer"] == 135


def test_counters_ext_is_kept_apart_from_counters() -> None:
    roce = by_name(sysfs.read_devices(SYS))["rocep8s0f0"].ports[0]
    # counters/ stuck at the 32-bit maximum is withheld, not replaced by counters_ext/
    assert roce.saturated == ["port_rcv_data", "port_xmit_data"]
    assert "port_rcv_data" not in roce.counters and roce.counters["port_rcv_packets"] == 9
    assert roce.legacy == {"port_rcv_data_64": 20_000_000_000, "port_xmit_data_64": 10_000_000_000}
    assert roce.link_layer == "Ethernet" and roce.rate_bytes == 12.5e9
    mlx4 = by_name(sysfs.read_devices(SYS))["mlx4_0"].ports
    # counters/ says 6,825,908,347 packets where the legacy twin says 0: counters/ counts
    assert mlx4[0].counters["port_rcv_packets"] == 6_825_908_347
    assert mlx4[0].legacy["port_rcv_packets_64"] == 0
    # and where counters/ reads 0 but the legacy twin has traffic, counters/ still counts
    assert mlx4[1].counters["port_rcv_packets"] == 0 and mlx4[1].legacy["port_rcv_packets_64"] == 70
    assert mlx4[1].saturated == ["port_xmit_wait"]


def test_iwarp_no_pma_and_unreadable_files_are_skipped() -> None:
    iw = by_name(sysfs.read_devices(SYS))["iwp1s0f0"]
    assert iw.node_type == "RNIC" and iw.hca_type == ""
    assert iw.ports[0].counters == {}
    assert iw.ports[0].hw_counters == {"ip4InReceives": 1000, "tcpInSegs": 900}


def test_uverbs_index_to_device() -> None:
    assert sysfs.uverbs_map(SYS) == {0: "mlx5_0", 1: "mlx5_1", 2: "rocep8s0f0", 3: "iwp1s0f0"}


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("200 Gb/sec (4X HDR)", 25e9),
        ("2.5 Gb/sec (1X SDR)", 312.5e6),
        ("garbage", None),
    ],
)
def test_rate(text: str, want: float | None) -> None:
    assert sysfs.parse_rate(text) == want


def test_statistic_text_and_json_agree() -> None:
    text = statistic.parse_text((FIX / "statistic.txt").read_text())
    js = statistic.parse_json((FIX / "statistic.json").read_text())
    assert [(s.device, s.port) for s in text] == [("mlx5_0", 1), ("mlx5_1", 1), ("rocep8s0f0", 1)]
    assert text[0].counters["out_of_buffer"] == 135
    assert text[2].counters["np_cnp_sent"] == 4
    for t, j in zip(text, js, strict=True):
        for name, value in j.counters.items():
            assert t.counters[name] == value
    assert [s.ifindex for s in js] == [0, 1, 2]


@pytest.mark.parametrize(
    "garbage",
    [
        "Segmentation fault\n",
        "link mlx5_0/1 rx_write_requests\n",
        "link mlx5_0/x a 1\n",
        "link mlx5_0/1 rx_write_requests lots\n",
    ],
)
def test_statistic_garbage_is_refused(garbage: str) -> None:
    with pytest.raises(statistic.StatParseError):
        statistic.parse_text(garbage)


@pytest.mark.parametrize("garbage", ["[{", '{"a": 1}', '[{"port": 1}]'])
def test_statistic_json_garbage_is_refused(garbage: str) -> None:
    with pytest.raises(statistic.StatParseError):
        statistic.parse_json(garbage)


def test_collector_exact_values_and_golden_exposition() -> None:
    c = RdmaCollector(5, SYS, runner=lambda: (FIX / "statistic.json").read_text())
    c.run_once()
    assert c.success and c.errors == {}
    got = samples(c)
    mlx = (("device", "mlx5_0"), ("port", "1"))
    assert got[("lens_rdma_port_transmit_bytes_total", mlx)] == 1234567 * 4
    assert ("lens_rdma_port_receive_bytes_total", mlx) not in got
    sat = tuple(sorted((*mlx, ("counter", "port_rcv_data"))))
    assert got[("lens_rdma_port_counter_saturated", sat)] == 1
    roce = (("device", "rocep8s0f0"), ("port", "1"))
    assert ("lens_rdma_port_receive_bytes_total", roce) not in got  # saturated in counters/
    assert got[("lens_rdma_port_legacy_receive_bytes_total", roce)] == 20_000_000_000 * 4
    assert got[("lens_rdma_port_hw_counter_total", (("counter", "np_cnp_sent"), *roce))] == 4
    assert got[("lens_rdma_port_up", (("device", "mlx5_1"), ("port", "1")))] == 0
    assert got[("rdma_stat_out_of_buffer", mlx)] == 135
    assert got[("rdma_stat_local_ack_timeout_err", roce)] == 6
    rows = {r["if_name"]: r for r in c.views["rdma"]}
    assert rows["mlx5_0"] == {
        "if_index": 0,
        "if_name": "mlx5_0",
        "port": 1,
        # eight bytes, as the node exporter writes GUIDs (sysfs: 0c42:a103:0065:2a3c)
        "node_guid": "0c:42:a1:03:00:65:2a:3c",
        "sys_image_guid": "0c:42:a1:03:00:65:2a:3c",
        "port_guid": "0c:42:a1:03:00:65:2a:3c",
        "link_layer": "InfiniBand",
        "state": "ACTIVE",
        "netdev": "ib0",
    }
    # not in rdma statistic: its position by name, or the next index no device holds
    assert rows["iwp1s0f0"]["if_index"] == 3  # position 0 is taken: the next free index
    check_golden("rdma.prom", render_metrics(c.snapshot()))


def test_garbage_tool_output_is_a_counted_parse_error() -> None:
    c = RdmaCollector(5, SYS, runner=lambda: "Segmentation fault (core dumped)\n")
    c.run_once()
    assert c.errors == {"parse": 1}
    got = samples(c)
    assert not any(name.startswith("rdma_stat_") for name, _ in got)
    assert got[("lens_rdma_port_up", (("device", "mlx5_0"), ("port", "1")))] == 1


def test_tool_timeout_is_counted() -> None:
    def hang() -> str:
        raise subprocess.TimeoutExpired(["rdma"], 5)

    c = RdmaCollector(5, SYS, runner=hang)
    c.run_once()
    assert c.errors == {"timeout": 1} and c.success


def test_no_rdma_hardware_exports_nothing(tmp_path: Path) -> None:
    c = RdmaCollector(5, tmp_path, runner=lambda: "")
    c.run_once()
    assert c.snapshot() == [] and c.errors == {} and c.success
    assert c.views["rdma"] == []


def rdma_tool(qp: str | None = None, link: str | None = None):
    """`rdma -j ARGS` as the fixtures answer it (the shapes iproute2 prints, captured from
    rxe on 6.12; mlx5_1's entries without `port`, as 5.10 prints some)."""

    def run(*args: str) -> str:
        if args == ("resource", "show", "qp"):
            return qp if qp is not None else (FIX / "resource-qp.json").read_text()
        if args == ("link", "show"):
            return link if link is not None else (FIX / "link.json").read_text()
        raise AssertionError(args)

    return run


PODS = {
    4242: {
        "namespace": "ml",
        "pod": "llm-0",
        "container": "trainer",
        "container_id": "a" * 64,
        "workload": "llm",
    },
    4343: {},
}


def test_queue_pairs_attributed_to_pods_and_the_kernels_own_kept() -> None:
    events: list = []
    c = RdmaCollector(5, SYS, rdma=rdma_tool(), identify=lambda pid: PODS.get(pid, {}))
    c.publish = events.append
    c.run_once()
    assert c.success and c.errors == {}
    v = samples(c)
    qps = {
        tuple(dict(lbl)[k] for k in ("device", "port", "type", "comm", "pod")): n
        for (name, lbl), n in v.items()
        if name == "lens_rdma_queue_pairs"
    }
    assert qps == {
        ("mlx5_0", "1", "SMI", "ib_core", ""): 1,
        ("mlx5_0", "1", "GSI", "ib_core", ""): 1,
        ("mlx5_0", "1", "RC", "python3", "llm-0"): 2,
        ("mlx5_0", "1", "UD", "ib_write_bw", ""): 1,
        ("mlx5_1", "1", "GSI", "ib_core", ""): 1,
        ("mlx5_1", "1", "RC", "python3", "llm-0"): 1,
    }
    assert v[("lens_rdma_queue_pairs_unlabelled", ())] == 0
    # /rdma: each port lists its QPs with pid, comm and identity; the netdev `rdma link`
    # names where sysfs has none; the device index `rdma link` reports
    rows = {(r["if_name"], r["port"]): r for r in c.views["rdma"]}
    mlx5 = rows[("mlx5_0", 1)]
    assert [(q["lqpn"], q["type"], q["pid"], q["comm"], q["pod"]) for q in mlx5["queue_pairs"]] == [
        (0, "SMI", None, "ib_core", ""),
        (1, "GSI", None, "ib_core", ""),
        (1057, "RC", 4242, "python3", "llm-0"),
        (1058, "RC", 4242, "python3", "llm-0"),
        (1060, "UD", 4343, "ib_write_bw", ""),
    ]
    assert rows[("mlx5_1", 1)]["if_index"] == 3 and rows[("mlx4_0", 2)]["queue_pairs"] == []
    assert rows[("mlx5_0", 1)]["netdev"] == "ib0"  # sysfs's, kept
    # one event: the container opened QPs on two devices
    assert [(e.kind, e.device, e.queue_pairs, e.pod) for e in events] == [
        ("rdma_open", "mlx5_0", 2, "llm-0"),
        ("rdma_open", "mlx5_1", 1, "llm-0"),
    ]
    # its process exits: closed on both, once
    c.rdma = rdma_tool(qp="[]")
    c.run_once()
    c.run_once()
    assert [(e.kind, e.device, e.queue_pairs) for e in events[2:]] == [
        ("rdma_close", "mlx5_0", 0),
        ("rdma_close", "mlx5_1", 0),
    ]
    assert not any(n == "lens_rdma_queue_pairs" for (n, _) in samples(c))


def test_rxe_netdev_index_and_node_type(tmp_path: Path) -> None:
    """Soft-RoCE's sysfs, as 6.12 lays it out: no device/ link, so no netdev there;
    `rdma link` names it (veth0) and the device index (0)."""
    dev = tmp_path / "class/infiniband/rxe0"
    port = dev / "ports/1"
    (port / "hw_counters").mkdir(parents=True)
    for name, text in {
        "node_type": "1: CA\n",
        "node_guid": "5854:10ff:fef1:dfa7\n",
        "sys_image_guid": "5854:10ff:fef1:dfa7\n",
        "fw_ver": "0.0.0\n",
    }.items():
        (dev / name).write_text(text)
    for name, text in {
        "state": "4: ACTIVE\n",
        "phys_state": "5: LinkUp\n",
        "link_layer": "Ethernet\n",
        "rate": "10 Gb/sec (1X QDR)\n",
    }.items():
        (port / name).write_text(text)
    (port / "hw_counters/rdma_sends").write_text("600\n")
    link = (
        '[{"ifindex":0,"ifname":"rxe0","port":1,"state":"ACTIVE","physical_state":'
        '"LINK_UP","netdev":"veth0","netdev_index":3}]'
    )
    c = RdmaCollector(5, tmp_path, rdma=rdma_tool(qp="[]", link=link))
    c.run_once()
    assert c.errors == {}
    (row,) = c.views["rdma"]
    assert (row["if_name"], row["if_index"], row["netdev"], row["queue_pairs"]) == (
        "rxe0",
        0,
        "veth0",
        [],
    )
    v = samples(c)
    info = next(dict(lbl) for (n, lbl) in v if n == "lens_rdma_device_info")
    assert (info["netdev"], info["node_type"]) == ("veth0", "CA")
    assert (
        v[
            (
                "lens_rdma_port_hw_counter_total",
                (("counter", "rdma_sends"), ("device", "rxe0"), ("port", "1")),
            )
        ]
        == 600
    )


@pytest.mark.parametrize("garbage", ["not json", "{}", '[{"ifname": "x"}]', '["x"]'])
def test_resource_garbage_is_a_counted_parse_error(garbage: str) -> None:
    c = RdmaCollector(5, SYS, rdma=rdma_tool(qp=garbage))
    c.run_once()
    assert c.success and c.errors == {"parse": 1}
    assert "queue_pairs" not in c.views["rdma"][0]  # unknown, not "none"
    assert not any(n.startswith("lens_rdma_queue_pairs") for (n, _) in samples(c))
    assert any(n == "lens_rdma_port_up" for (n, _) in samples(c))  # the rest still served


def test_per_qp_counters_when_asked_summed_per_pod() -> None:
    """collectors.rdma.qp_counters: each port asked once to bind (mlx5_0 takes it, the
    others refuse as rxe and siw do), then the counters the driver keeps, per pod."""
    asked: list[tuple[str, int]] = []

    def bind(device: str, port: int) -> str:
        asked.append((device, port))
        return "" if device == "mlx5_2" or device == "mlx5_0" else "Operation not supported"

    text = (FIX / "statistic-qp.txt").read_text()
    tool = rdma_tool()

    def run(*args: str) -> str:
        return text if args == ("statistic", "qp", "show") else tool(*args)

    pods = {30893: {"namespace": "ml", "pod": "llm-0", "container": "trainer"}}
    c = RdmaCollector(5, SYS, rdma=run, identify=lambda pid: pods.get(pid, {}), bind=bind)
    c.run_once()
    c.run_once()
    assert c.errors == {}
    assert sorted(asked) == sorted(
        {(d.name, p.number) for d in sysfs.read_devices(SYS) for p in d.ports}
    )
    v = samples(c)
    key = (
        "lens_rdma_qp_counter_total",
        (
            ("comm", "python3"),
            ("container", "trainer"),
            ("counter", "rx_write_requests"),
            ("device", "mlx5_2"),
            ("namespace", "ml"),
            ("pod", "llm-0"),
            ("port", "1"),
            ("workload", ""),
        ),
    )
    assert v[key] == 41
    host = (
        "lens_rdma_qp_counter_total",
        (
            ("comm", "ib_send_bw"),
            ("container", ""),
            ("counter", "out_of_sequence"),
            ("device", "mlx5_2"),
            ("namespace", ""),
            ("pod", ""),
            ("port", "1"),
            ("workload", ""),
        ),
    )
    assert v[host] == 7
    bound = {
        dict(lbl)["device"]: n
        for (name, lbl), n in v.items()
        if name == "lens_rdma_qp_counters_bound"
    }
    assert bound["mlx5_0"] == 1 and bound["mlx4_0"] == 0


def test_per_qp_counters_off_by_default() -> None:
    c = RdmaCollector(5, SYS, rdma=rdma_tool())
    c.run_once()
    assert not any(n.startswith("lens_rdma_qp_counter") for (n, _) in samples(c))


def test_per_qp_counter_garbage_is_a_counted_parse_error() -> None:
    """Unparsable `rdma statistic qp show` output: counted, and the rest still served."""
    tool = rdma_tool()

    def run(*args: str) -> str:
        return "Segmentation fault\n" if args == ("statistic", "qp", "show") else tool(*args)

    c = RdmaCollector(5, SYS, rdma=run, bind=lambda device, port: "")
    c.run_once()
    assert c.success and c.errors == {"parse": 1}
    v = samples(c)
    assert not any(n == "lens_rdma_qp_counter_total" for (n, _) in v)
    assert any(n == "lens_rdma_queue_pairs" for (n, _) in v)
