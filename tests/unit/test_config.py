from pathlib import Path

import pytest

from lens_ebpf.agent import config
from lens_ebpf.core.settings import ConfigError
from lens_ebpf.recorder import config as recorder_config


def test_defaults_come_from_the_shipped_file() -> None:
    cfg = config.load(None, env={})
    assert cfg.server.port == 9470
    assert cfg.server.host == "0.0.0.0"
    assert cfg.collectors.tcp.enabled is True
    assert config.policy_path(cfg).name == "policy.yaml"


def test_file_then_env_then_flags(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("server:\n  port: 9000\n  host: 10.0.0.1\ncache:\n  ttl_seconds: 30\n")
    env = {"LENS_SERVER__PORT": "9001", "NODE_NAME": "gpu-7", "NODE_IP": "10.1.2.3"}
    cfg = config.load(f, env=env, overrides={("server", "port"): 9002})
    assert cfg.server.port == 9002
    assert cfg.server.host == "10.0.0.1"
    assert cfg.cache.ttl_seconds == 30
    assert cfg.node.name == "gpu-7" and cfg.node.ip == "10.1.2.3"
    assert cfg.node_name == "gpu-7"


def test_system_info_exporter_env_names_still_work() -> None:
    cfg = config.load(None, env={"APP__SERVER__HOST": "127.0.0.2", "APP__SERVER__PORT": "9555"})
    assert (cfg.server.host, cfg.server.port) == ("127.0.0.2", 9555)


def test_lens_env_wins_over_app_alias() -> None:
    cfg = config.load(None, env={"APP__SERVER__PORT": "9555", "LENS_SERVER__PORT": "9556"})
    assert cfg.server.port == 9556


def test_config_file_from_env(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("log_level: debug\n")
    assert config.load(None, env={"LENS_CONFIG": str(f)}).log_level == "debug"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("server:\n  prot: 1\n", "server.prot: unknown key"),
        ("server:\n  port: abc\n", "server.port: Input should be a valid integer"),
        ("server:\n  port: 70000\n", "server.port"),
        ("bpf:\n  ringbuf_pages: 100\n", "bpf.ringbuf_pages: Value error, must be a power of two"),
        ("log_level: loud\n", "log_level"),
        ("- a\n- b\n", "top level must be a mapping"),
        ("server: [\n", "not valid YAML: line"),
    ],
)
def test_bad_file_names_key_and_reason(tmp_path: Path, text: str, needle: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as err:
        config.load(f, env={})
    msg = str(err.value)
    assert needle in msg
    assert str(f) in msg
    assert "\n" not in msg


def test_unknown_env_key_is_refused() -> None:
    with pytest.raises(ConfigError, match="environment LENS_SERVER__PROT: unknown key server.prot"):
        config.load(None, env={"LENS_SERVER__PROT": "1"})


# What the kubelet gives every pod of a namespace with Services lens-ebpf-recorder (9480 and
# 9472) and lens-ebpf (9470), unless the pod sets enableServiceLinks: false.
SERVICE_LINKS = {
    "LENS_EBPF_RECORDER_SERVICE_HOST": "10.96.0.20",
    "LENS_EBPF_RECORDER_SERVICE_PORT": "9480",
    "LENS_EBPF_RECORDER_SERVICE_PORT_HTTP": "9480",
    "LENS_EBPF_RECORDER_SERVICE_PORT_COLLECTOR": "9472",
    "LENS_EBPF_RECORDER_PORT": "tcp://10.96.0.20:9480",
    "LENS_EBPF_RECORDER_PORT_9480_TCP": "tcp://10.96.0.20:9480",
    "LENS_EBPF_RECORDER_PORT_9480_TCP_PROTO": "tcp",
    "LENS_EBPF_RECORDER_PORT_9480_TCP_PORT": "9480",
    "LENS_EBPF_RECORDER_PORT_9480_TCP_ADDR": "10.96.0.20",
    "LENS_EBPF_RECORDER_PORT_9472_TCP": "tcp://10.96.0.20:9472",
    "LENS_EBPF_SERVICE_HOST": "fd00::14",
    "LENS_EBPF_PORT": "tcp://[fd00::14]:9470",
    "LENS_EBPF_PORT_9470_TCP_ADDR": "fd00::14",
}


@pytest.mark.parametrize("load", [config.load, recorder_config.load], ids=["agent", "recorder"])
def test_the_kubelets_service_links_are_not_settings(load) -> None:
    """A pod of the recorder's namespace starts with the links its Services give it."""
    cfg = load(None, env={**SERVICE_LINKS, "LENS_SERVER__PORT": "9555"})
    assert cfg.server.port == 9555


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("LENS_SERVR__PORT", "tcp://10.96.0.20:9480"),  # our separator: ours, mistyped
        ("LENS_SERVER__SERVICE_HOST", "10.96.0.20"),  # a known section's key
        ("LENS_EBPF_RECORDER_PORT", "9480"),  # a link's name, not its value
        ("LENS_EBPF_RECORDER_SERVICE_HOST", "recorder.local"),
        ("LENS_EBPF_RECORDER_PORT_9480_TCP_PROTO", "http"),
        ("LENS_LOG_LEVL", "debug"),
    ],
)
def test_what_only_looks_like_a_service_link_is_still_refused(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"environment {name}: unknown key"):
        config.load(None, env={name: value})


def test_bad_env_value_is_refused() -> None:
    with pytest.raises(ConfigError, match="server.port: Input should be a valid integer"):
        config.load(None, env={"LENS_SERVER__PORT": "nine"})


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="No such file"):
        config.load(tmp_path / "nope.yaml", env={})


def test_string_settings_take_the_environment_as_written(tmp_path) -> None:
    """off, on, yes are strings where the setting is a string (YAML would make them bools)."""
    env = {
        "LENS_KUBERNETES__MODE": "off",
        "NODE_NAME": "on",
        "LENS_COLLECTORS__GPU__AMD_SMI": "yes",
        "LENS_COLLECTORS__GPU__ENABLED": "false",
        "LENS_KUBERNETES__KUBELET__GPU_RESOURCES": "[amd.com/gpu]",
    }
    cfg = config.load(None, env=env)
    assert (cfg.kubernetes.mode, cfg.node.name) == ("off", "on")
    assert cfg.collectors.gpu.amd_smi == "yes" and cfg.collectors.gpu.enabled is False
    assert cfg.kubernetes.kubelet.gpu_resources == ["amd.com/gpu"]
    f = tmp_path / "lens.yaml"
    f.write_text("kubernetes:\n  mode: off\n")  # the documented spelling, in a file
    assert config.load(f, env={}).kubernetes.mode == "off"


def test_sizes_are_bounded() -> None:
    with pytest.raises(ConfigError, match=r"bpf.max_sockets: Input should be less than or equal"):
        config.load(None, env={"LENS_BPF__MAX_SOCKETS": "99999999999"})
    with pytest.raises(ConfigError, match=r"cache.max_series: Input should be less than or equal"):
        config.load(None, env={"LENS_CACHE__MAX_SERIES": "1000000000000"})
