#!/usr/bin/env bash
# Installs what lens-ebpf needs on a Debian 12 machine, idempotently.
#   scripts/setup.sh run     the node agent: its packages, the venv with .[agent], the
#                            compiled event path (gcc, python3-dev), kernel headers, tracefs
#   scripts/setup.sh test    the same plus what the test suite drives (containerd, runc,
#                            prometheus, prometheus-alertmanager, victoria-metrics,
#                            bpfcc-tools, dwarves (pahole,
#                            the BTF reader's reference), gcc, QEMU, rdma-core's verbs
#                            programs for Soft-RoCE in the guests, PostgreSQL for the
#                            recorder's tests, chromium and poppler-utils for the weekly
#                            report's PDF and its tests, etcd-server for the real API
#                            server lab, buildah, debootstrap, containernetworking-plugins,
#                            iptables, conntrack and socat for the real node lab, bpftool
#                            for the drop reasons' reference), the
#                            venv with .[dev] (both services and the test tools), Debian's
#                            5.10, 6.1 and 6.12 kernels for the kernel matrix, a
#                            kube-apiserver, kubelet, kube-controller-manager,
#                            kube-scheduler and kube-proxy built from Debian's source and
#                            the node lab's container images (both cached)
#   scripts/setup.sh image   the agent image's install step (Dockerfile, target agent):
#                            packages and venv only; the agent mounts tracefs and finds
#                            headers itself at start-up
#   scripts/setup.sh recorder-image
#                            the recorder's image (target recorder): Python and the
#                            venv with .[recorder]; no BCC, no kernel headers
# The images install with this same script, so its steps are tested where the README's are.
set -euo pipefail
mode=${1:-run}
cd "$(dirname "$0")/.."

case "$mode" in
  run|test|image) pkgs=(python3-bpfcc python3-venv python3-pip linux-headers-amd64 iproute2 kmod
                        gcc libc6-dev python3-dev)
                  extras="[agent]" ;;
  recorder-image)  pkgs=(python3-venv python3-pip); extras="[recorder]" ;;
  *) echo "setup: unknown mode $mode (run, test, image, recorder-image)" >&2; exit 2 ;;
esac
if [ "$mode" = test ]; then
  pkgs+=(bpfcc-tools dwarves containerd runc prometheus prometheus-alertmanager victoria-metrics gcc libc6-dev busybox-static openssl
         qemu-system-x86 xz-utils zstd rdma-core ibverbs-providers ibverbs-utils postgresql
         chromium poppler-utils etcd-server
         buildah debootstrap containernetworking-plugins iptables conntrack socat bpftool)
  extras="[dev]"
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
  case "$mode" in *image) rm -rf /var/lib/apt/lists/* ;; esac
fi

# The venv sees Debian's python3-bpfcc through --system-site-packages.
if [ ! -x .venv/bin/python ]; then
  /usr/bin/python3 -m venv --system-site-packages .venv
fi
stamp=.venv/.setup-stamp-${mode}
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-cache-dir -e ".${extras}"
  touch "$stamp"
fi

# The trace viewer the recorder serves at a viewer session's ui_path (speedscope, pinned):
# its built files from the npm registry's tarball, checked against the registry's sha512,
# under the venv (.venv/share/speedscope), never in the repository;
# recorder.profiler.viewer_dir names another place. No node or npm: Python fetches it,
# trusting pip's CA file where pip has one (the same network pip's installs took).
viewer=speedscope@1.25.0
viewer_sha512=cpf9HWTZf1ijLXBJrk87Ve/54tnYx6rlf0gUThvn3ook6h63hLXVOQiMf44PT+XoV503cPfvfiT5gP5vojp6Ag==
case "$mode" in test|recorder-image)
  if [ "$(cat .venv/share/speedscope/.version 2>/dev/null)" != "$viewer" ]; then
    .venv/bin/python - "$viewer" "$viewer_sha512" <<'PY'
import base64, hashlib, io, re, shutil, ssl, subprocess, sys, tarfile, urllib.request
from pathlib import Path
spec, want = sys.argv[1:3]
# pip's CA file, as pip merges its configuration (files and PIP_CERT), where it has one
listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                        capture_output=True, text=True).stdout
certs = re.findall(r"^(?::env:|global|install)\.cert='(.*)'$", listed, re.M)
cafile = certs[0] if certs else ""
name, version = spec.split("@")
url = f"https://registry.npmjs.org/{name}/-/{name}-{version}.tgz"
ctx = ssl.create_default_context(cafile=cafile or None)
data = urllib.request.urlopen(url, context=ctx, timeout=120).read()
got = base64.b64encode(hashlib.sha512(data).digest()).decode()
if got != want:
    sys.exit(f"setup: {url}: sha512 {got}, not the pinned {want}")
dest, tmp = Path(".venv/share/speedscope"), Path(".venv/share/.speedscope.new")
shutil.rmtree(tmp, ignore_errors=True)
with tarfile.open(fileobj=io.BytesIO(data)) as tar:
    for m in tar.getmembers():
        rel = Path(m.name)
        if m.isfile() and rel.parts[:3] == ("package", "dist", "release"):
            out = tmp / Path(*rel.parts[3:])
        elif m.isfile() and m.name == "package/LICENSE":
            out = tmp / "LICENSE"
        else:
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(tar.extractfile(m).read())
(tmp / ".version").write_text(spec + "\n")
shutil.rmtree(dest, ignore_errors=True)
tmp.rename(dest)
PY
  fi ;;
esac

# The compiled event path (lens_ebpf/agent/native: ring records to their wire bytes in
# C), built for this Python each time: a second or two.
case "$mode" in run|test|image) .venv/bin/python -m lens_ebpf.agent.native ;; esac

# tracefs and a kernel header tree BCC can compile against (lens_ebpf/agent/kernel_headers.py).
case "$mode" in run|test) .venv/bin/python -m lens_ebpf.agent.kernel_headers --prepare ;; esac

# The kernel matrix's kernels: the newest image of each series, resolved on every run
# (Debian drops superseded ABIs) and cached. Without them the matrix skips, saying why.
if [ "$mode" = test ]; then
  if ! .venv/bin/python -m tests.vm.kernels fetch; then
    echo "setup: kernel matrix kernels not fetched; tests/vm will skip" >&2
  fi
  # `make test` (scripts/test.sh) boots the guests now, so that they run while the rest
  # of the setup, lint and the host's tests run (tests/vm/background.py)
  if [ -n "${PYTEST_KMATRIX_DIR:-}" ]; then
    .venv/bin/python -m tests.vm.background "$PYTEST_KMATRIX_DIR"
  fi
fi

# The real API server lab's kube-apiserver and the real node's kubelet,
# kube-controller-manager, kube-scheduler and kube-proxy (built from Debian's kubernetes
# source, about 9 min on 2 cores the first time, then cached) and kubectl. Without them
# tests/kube skips.
if [ "$mode" = test ]; then
  if ! .venv/bin/python -m tests.kube.build; then
    echo "setup: Kubernetes not built; the real API server and node tests will skip" >&2
  fi
fi

# The real node lab's container images, made without a registry (tests/kube/images.py):
# pause, busybox and a debootstrap Debian base once (about 1 min), the Dockerfile's two
# images again when what it copies changed (4-7 min on 2 cores). Without them the node's
# tests skip.
if [ "$mode" = test ]; then
  if ! .venv/bin/python -m tests.kube.images; then
    echo "setup: the node lab's images not built; the real node tests will skip" >&2
  fi
fi
