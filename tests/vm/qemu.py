"""Boot one of Debian's kernels in QEMU over this machine's own root and run a command.

The host root is shared read-only over virtio-9p and mounted under a tmpfs overlay, so
the guest runs this checkout and its venv as they are, on another kernel. The guest's
/lib/modules/<abi> points at the unpacked kernel package (modprobe works) with `build`
at the matching headers or left for the agent's own fallback. What the command writes
to $KMATRIX_OUT comes back in a writable 9p share; its exit status is written there too.

    python -m tests.vm.qemu 6.1 -- uname -r
"""

from __future__ import annotations

import argparse
import gzip
import io
import lzma
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.vm import kernels

BUSYBOX = Path("/bin/busybox")
# What mounting a 9p root under overlay needs, in load order; some are built in.
BOOT_MODULES = (
    "virtio_ring",
    "virtio",
    "virtio_pci_modern_dev",
    "virtio_pci_legacy_dev",
    "virtio_pci",
    "netfs",
    "fscache",
    "9pnet",
    "9pnet_virtio",
    "9p",
    "overlay",
)

INIT = r"""#!/bin/busybox sh
OUTDIR=/lens-vm-out
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules.order); do insmod /mods/$m.ko 2>/dev/null; done
mkdir -p /host /rw /newroot
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=loose,ro hostroot /host || {
  echo "lens-vm: cannot mount the host root"; poweroff -f; }
mount -t tmpfs -o size=75% tmpfs /rw
mkdir -p /rw/upper /rw/work
mount -t overlay overlay -o lowerdir=/host,upperdir=/rw/upper,workdir=/rw/work /newroot || {
  echo "lens-vm: cannot mount the overlay"; poweroff -f; }
mkdir -p /newroot/$OUTDIR
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 out /newroot/$OUTDIR
cp /guest.sh /newroot/lens-vm-guest.sh
exec switch_root /newroot /bin/sh /lens-vm-guest.sh
"""

# Runs as PID 1 inside the new root.
GUEST = r"""
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
mount -t proc proc /proc 2>/dev/null
mount -t sysfs sys /sys 2>/dev/null
mount -t devtmpfs dev /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm && mount -t devpts devpts /dev/pts && mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /run && mkdir -p /run/netns /run/lock /run/tmp
# /tmp stays the host's, seen through the overlay (a checkout may live there); the
# guest's own temporary files go to a tmpfs
export TMPDIR=/run/tmp
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t bpf bpf /sys/fs/bpf
mount -t debugfs debugfs /sys/kernel/debug
mount -t tracefs tracefs /sys/kernel/tracing
abi=$(uname -r)
mkdir -p /lib/modules/$abi
for f in $MODDIR/*; do ln -sf "$f" /lib/modules/$abi/; done
rm -f /lib/modules/$abi/build /lib/modules/$abi/source
[ -n "$HEADERS" ] && ln -s "$HEADERS" /lib/modules/$abi/build
[ -n "$HEADERS_SOURCE" ] && ln -s "$HEADERS_SOURCE" /lib/modules/$abi/source
ip link set lo up
hostname lens-vm
# the command's output reaches the share as it is written: the host reads its growth
# as the guest's progress
export KMATRIX_OUT=$OUTDIR KMATRIX_KERNEL=$abi PYTHONUNBUFFERED=1
cd $WORKDIR
echo "lens-vm: running on $abi"
/bin/sh -c "$COMMAND" > $OUTDIR/console.log 2>&1
echo $? > $OUTDIR/rc
sync
echo o > /proc/sysrq-trigger
sleep 5
"""


def _open_module(path: Path) -> bytes:
    data = path.read_bytes()
    if path.suffix == ".xz":
        return lzma.decompress(data)
    if path.suffix == ".zst":
        return subprocess.run(["zstd", "-dc", str(path)], capture_output=True, check=True).stdout
    if path.suffix == ".gz":
        return gzip.decompress(data)
    return data


def _module_paths(moddir: Path) -> dict[str, Path]:
    """module name -> its file, from modules.dep (names with - and _ alike)."""
    out = {}
    for line in (moddir / "modules.dep").read_text().splitlines():
        rel = line.split(":", 1)[0]
        name = Path(rel).name.split(".ko")[0].replace("-", "_")
        out[name] = moddir / rel
    return out


def _newc(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A newc cpio archive of (name, mode, data); directories have empty data."""
    buf = io.BytesIO()
    for ino, (name, mode, data) in enumerate([*entries, ("TRAILER!!!", 0, b"")], start=1):
        nb = name.encode() + b"\0"
        hdr = "070701" + "".join(
            f"{v:08X}" for v in (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(nb), 0)
        )
        buf.write(hdr.encode() + nb)
        buf.write(b"\0" * ((4 - (110 + len(nb)) % 4) % 4))
        buf.write(data)
        buf.write(b"\0" * ((4 - len(data) % 4) % 4))
    return buf.getvalue()


def build_initramfs(kernel: kernels.Kernel, guest: str, dest: Path) -> None:
    """busybox, the boot modules this kernel builds as modules, the init and guest scripts."""
    paths = _module_paths(kernel.modules)
    order = [m for m in BOOT_MODULES if m in paths]  # the rest are built in
    entries: list[tuple[str, int, bytes]] = [
        (d, 0o40755, b"") for d in ("bin", "dev", "proc", "sys", "mods", "host", "rw", "newroot")
    ]
    entries.append(("bin/busybox", 0o100755, BUSYBOX.read_bytes()))
    for m in order:
        entries.append((f"mods/{m}.ko", 0o100644, _open_module(paths[m])))
    entries.append(("modules.order", 0o100644, "\n".join(order).encode() + b"\n"))
    entries.append(("init", 0o100755, INIT.encode()))
    entries.append(("guest.sh", 0o100755, guest.encode()))
    dest.write_bytes(gzip.compress(_newc(entries), compresslevel=1))


@dataclass
class Result:
    rc: int  # the command's exit status; -1 when the guest never wrote one
    output: str  # what the command printed
    console: str  # the kernel's serial console
    seconds: float
    out: Path  # the share the command wrote into
    hung: str = ""  # why the guest was stopped, when it was: it stopped making progress
    cpu_seconds: float = 0.0  # the QEMU process's CPU time (user and system), as last seen


# A guest is as slow as the emulated CPU and the machine's load make it; what makes it
# hung is silence: neither its command nor its kernel wrote anything for this long.
STALL_SECONDS = 600.0
# and, as a last resort, a guest still busy after this long is stopped too
CAP_SECONDS = 3 * 3600.0
POLL_SECONDS = 2.0


def _cpu(pid: int) -> float:
    """A live process's CPU seconds (user and system); 0.0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def boot(
    kernel: kernels.Kernel,
    command: str,
    *,
    workdir: Path,
    headers: str = "matching",
    memory_mb: int = 3072,
    cpus: int = 1,
    stall: float = STALL_SECONDS,
    cap: float = CAP_SECONDS,
    out: Path | None = None,
) -> Result:
    """Run command (sh -c) in a guest on kernel; headers: "matching" or "fallback".

    The guest runs as long as it makes progress: it is stopped (Result.hung says why)
    only when neither the command's output nor the serial console grew for `stall`
    seconds, or after `cap`."""
    if shutil.which("qemu-system-x86_64") is None:
        raise RuntimeError("qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)")
    out = out or Path(tempfile.mkdtemp(prefix=f"lens-vm-{kernel.series}-"))
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("rc", "console.log", "serial.log"):
        (out / stale).unlink(missing_ok=True)
    env = {
        "OUTDIR": "/lens-vm-out",  # as INIT mounts it
        "MODDIR": str(kernel.modules),
        "HEADERS": str(kernel.headers) if headers == "matching" else "",
        "HEADERS_SOURCE": str(kernel.headers_source or "") if headers == "matching" else "",
        "WORKDIR": str(workdir),
        "COMMAND": command,
    }
    guest = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()) + GUEST
    hung = ""
    with tempfile.TemporaryDirectory(prefix="lens-vm-initrd-") as tmp:
        initrd = Path(tmp) / "initrd.gz"
        build_initramfs(kernel, guest, initrd)
        cmd = [
            "qemu-system-x86_64",
            "-machine",
            "accel=tcg",
            "-cpu",
            "max",
            "-smp",
            str(cpus),
            "-m",
            str(memory_mb),
            "-kernel",
            str(kernel.vmlinuz),
            "-initrd",
            str(initrd),
            "-append",
            "console=ttyS0 panic=-1 quiet loglevel=3 rdinit=/init",
            "-nographic",
            "-no-reboot",
            "-nic",
            "none",
            "-virtfs",
            "local,path=/,mount_tag=hostroot,security_model=none,readonly=on," "multidevs=remap",
            "-virtfs",
            f"local,path={out},mount_tag=out,security_model=none,multidevs=remap",
        ]
        started = time.monotonic()
        serial = out / "serial.log"
        with serial.open("wb") as console_file:
            proc = subprocess.Popen(
                cmd, stdout=console_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
            progress, last, cpu = (-1, -1), started, 0.0
            while proc.poll() is None:
                time.sleep(POLL_SECONDS)
                cpu = _cpu(proc.pid) or cpu
                now = time.monotonic()
                seen = (_size(out / "console.log"), _size(serial))
                if seen != progress:
                    progress, last = seen, now
                elif now - last > stall:
                    hung = f"no output from the guest for {stall:.0f} s"
                if now - started > cap:
                    hung = f"still running after {cap:.0f} s"
                if hung:
                    proc.kill()
                    proc.wait()
                    break
    elapsed = time.monotonic() - started
    console = serial.read_text(errors="replace")
    if hung:
        console += f"\nlens-vm: stopped: {hung}"
    rc_file = out / "rc"
    rc = int(rc_file.read_text().strip() or -1) if rc_file.exists() else -1
    log = out / "console.log"
    output = log.read_text(errors="replace") if log.exists() else ""
    return Result(rc, output, console, elapsed, out, hung, cpu)


def by_series(series: str) -> kernels.Kernel:
    for k in kernels.cached():
        if k.series == series:
            return k
    raise LookupError(f"kernel {series} is not fetched: python -m tests.vm.kernels fetch")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tests.vm.qemu",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("series", help="5.10, 6.1 or 6.12")
    ap.add_argument("--headers", choices=("matching", "fallback"), default="matching")
    ap.add_argument("--out", type=Path)
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = ap.parse_args(argv[:cut])
    command = " ".join(argv[cut + 1 :])
    res = boot(
        by_series(args.series), command, workdir=Path.cwd(), headers=args.headers, out=args.out
    )
    print(res.output, end="")
    if res.rc < 0:
        print(res.console[-3000:], file=sys.stderr)
    print(
        f"lens-vm: {args.series} rc={res.rc} in {res.seconds:.1f}s, files in {res.out}",
        file=sys.stderr,
    )
    return res.rc if res.rc >= 0 else 125


if __name__ == "__main__":
    sys.exit(main())
