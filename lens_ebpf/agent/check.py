"""`lens-ebpf check`: what this kernel and node support, and why not."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lens_ebpf.agent import kernel_headers, tracefs
from lens_ebpf.agent.bpf.spec import Kernel, Plan, feature_path
from lens_ebpf.agent.bpf.syscall import ringbuf_supported
from lens_ebpf.agent.config import Config
from lens_ebpf.agent.feature import feature_classes

# The programs' specs are the one list of what each feature needs (bpf/spec.py).
SPECS = tuple(spec for cls in feature_classes() for spec in cls.specs)


def feature_plans(kernel: Kernel) -> dict[str, tuple[Plan, list[str]]]:
    """feature -> (its program's plan on this kernel, the needs the feature covers)."""
    return {name: got for cls in feature_classes() for name, got in cls.plans(kernel).items()}


def feature_support(plan: Plan, needs: list[str]) -> dict[str, Any]:
    """Whether a feature would load here, by which path, and why not or what it loses."""
    chosen = {n: plan.choices[n] for n in needs}
    paths = {n: c.label for n, c in chosen.items()}
    path = feature_path(paths.values())
    reasons = [f"{n}: {c.reason}" for n, c in chosen.items() if c.reason]
    reasons += plan.degraded_for(needs)
    if not plan.loadable:
        reasons.insert(0, plan.off_reason)
    # off_reason repeats the needs' own reasons: each piece once
    pieces = [piece for r in reasons for piece in r.split("; ")]
    return {
        # loadable: every required need of the program has a path; and this feature uses one
        "supported": plan.loadable and path != "off",
        "path": path,
        "paths": paths,
        "reason": "; ".join(dict.fromkeys(pieces)),
    }


@dataclass
class Check:
    name: str
    ok: bool
    value: str
    detail: str = ""


def cgroup_mode(root: Path = Path("/sys/fs/cgroup")) -> str:
    if (root / "cgroup.controllers").exists():
        return "v2"
    if (root / "unified" / "cgroup.controllers").exists():
        return "hybrid (v1 controllers, v2 at unified/)"
    return "v1"


def _library(names: tuple[str, ...]) -> str | None:
    for name in names:
        try:
            ctypes.CDLL(name)
            return name
        except OSError:
            continue
    return None


def kubernetes_check(kubeconfig: str = "", timeout: float = 3.0) -> Check:
    """Which API the agent would use (in-cluster, else kubeconfig), and its version."""
    from lens_ebpf.k8s.client import NotConfiguredError, api_client

    try:
        api = api_client("auto", kubeconfig)
    except NotConfiguredError as exc:
        return Check("kubernetes", False, "standalone", f"{exc}; policy-only classification")
    except Exception as exc:
        return Check("kubernetes", False, "error", str(exc))
    from kubernetes import client

    host = api.configuration.host
    try:
        version = client.VersionApi(api).get_code(_request_timeout=timeout)
    except Exception as exc:  # refused, TLS, 401: say which
        reason = getattr(exc, "reason", None) or type(exc).__name__
        return Check("kubernetes", False, host, f"unreachable: {str(reason)[:200]}")
    return Check("kubernetes", True, host, f"reachable, {version.git_version}")


def run_checks(cfg: Config | None = None) -> dict[str, Any]:
    """Probe the node; every entry says what was found and, when missing, why. With a
    config, also each setting the system tuner would keep, read and never changed."""
    checks: list[Check] = []
    checks.append(Check("kernel", True, platform.release()))
    btf = Path("/sys/kernel/btf/vmlinux").exists()
    checks.append(Check("btf", btf, "yes" if btf else "no", "/sys/kernel/btf/vmlinux"))
    events = tracefs.events_dir()
    mounted = ""
    if events is None and os.geteuid() == 0:  # as the agent does at start (Ubuntu 24.04's
        tracefs.ensure_mounted()  # GPU nodes boot without it), so the tracepoints below count
        events = tracefs.events_dir()
        mounted = "mounted (as the agent does)" if events else ""
    checks.append(
        Check(
            "tracefs",
            events is not None,
            str(events.parent) if events else "not mounted",
            mounted if events else "mount -t tracefs tracefs /sys/kernel/tracing",
        )
    )
    kp = tracefs.kprobes_available()
    checks.append(
        Check(
            "kprobes",
            kp,
            "yes" if kp else "no",
            "" if kp else "no kprobe_events in tracefs: kernel built without kprobes",
        )
    )
    rb_ok, rb_detail = ringbuf_supported()
    checks.append(Check("ringbuf", rb_ok, "yes" if rb_ok else "no", rb_detail))
    tree = kernel_headers.resolve()
    checks.append(Check("kernel_headers", tree.found, tree.source, tree.detail))
    try:
        import bcc

        checks.append(Check("bcc", True, str(getattr(bcc, "__version__", "unknown"))))
    except Exception as exc:
        checks.append(Check("bcc", False, "missing", f"{exc}; install python3-bpfcc"))
    checks.append(Check("cgroup", True, cgroup_mode()))
    psi = Path("/proc/pressure/cpu")
    psi_ok = psi.exists() and os.access(psi, os.R_OK)
    checks.append(
        Check(
            "psi",
            psi_ok,
            "yes" if psi_ok else "no",
            "" if psi_ok else "/proc/pressure missing (boot with psi=1)",
        )
    )
    sock = Path("/run/containerd/containerd.sock")
    checks.append(Check("containerd", sock.exists(), str(sock) if sock.exists() else "no socket"))
    checks.append(kubernetes_check())
    nvml = _library(("libnvidia-ml.so.1",))
    checks.append(
        Check(
            "nvml",
            nvml is not None,
            nvml or "absent",
            shutil.which("nvidia-smi") or "no nvidia-smi",
        )
    )
    # where the amdsmi binding looks first: $ROCM_HOME or $ROCM_PATH, then the linker's path
    rocm = os.environ.get("ROCM_HOME", os.environ.get("ROCM_PATH", ""))
    amd = _library((*([f"{rocm}/lib/libamd_smi.so"] if rocm else []), "libamd_smi.so"))
    checks.append(
        Check("amdsmi", amd is not None, amd or "absent", shutil.which("amd-smi") or "no amd-smi")
    )
    kernel = Kernel.running(SPECS)
    present = {tp: kernel.has_tracepoint(tp) for spec in SPECS for tp in spec.all_tracepoints()}
    features = {
        feature: feature_support(plan, needs)
        for feature, (plan, needs) in feature_plans(kernel).items()
    }
    out = {
        "checks": {c.name: asdict(c) for c in checks},
        "tracepoints": present,
        "features": features,
    }
    if cfg is not None:
        from lens_ebpf.agent.features import tuner

        s = cfg.collectors.section("tuner")
        assert isinstance(s, tuner.TunerSettings)
        rows = tuner.check_rows(Path(cfg.devices.procfs_root) / "sys", tuner.desired_settings(s))
        out["tuner"] = {"enabled": s.enabled, "settings": list(rows)}
    return out


def format_table(result: dict[str, Any]) -> str:
    """The check's result as an 80-column table for people."""
    lines = [f"{'CHECK':<16} {'OK':<4} {'VALUE':<26} DETAIL"]
    for c in result["checks"].values():
        lines.append(
            f"{c['name']:<16} {'yes' if c['ok'] else 'no':<4} "
            f"{c['value'][:26]:<26} {c['detail']}"[:80].rstrip()
        )
    lines.append("")
    lines.append(f"{'TRACEPOINT':<40} PRESENT")
    for tp, ok in result["tracepoints"].items():
        lines.append(f"{tp:<40} {'yes' if ok else 'no'}")
    lines.append("")
    lines.append(f"{'FEATURE':<12} {'SUPPORTED':<10} {'PATH':<11} REASON")
    for name, f in result["features"].items():
        ok = "yes" if f["supported"] else "no"
        lines.append(f"{name:<12} {ok:<10} {f['path']:<11} {f['reason']}"[:80])
    if "tuner" in result:
        t = result["tuner"]
        lines.append("")
        lines.append(f"tuner: {'on' if t['enabled'] else 'off (--tuner turns it on)'}")
        lines.append(f"{'SETTING':<20} {'DESIRED':>10} {'CURRENT':>10} ACTION")
        for r in t["settings"]:
            cur = "-" if r["current"] is None else str(r["current"])
            lines.append(f"{r['setting']:<20} {r['desired']:>10} {cur:>10} {r['action']}"[:80])
    return "\n".join(lines)
