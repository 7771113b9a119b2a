# lens-ebpf node agent: Debian 12 with python3-bpfcc, run as a privileged DaemonSet.
# Kernel headers come from the host (/lib/modules, /usr/src mounted by deploy/);
# the image carries Debian's linux-headers-amd64 as the fallback the agent links in
# (another kernel's headers are safe: tracepoint fields and probe arguments only).
FROM debian:bookworm-20241111-slim

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /opt/lens-ebpf

COPY pyproject.toml README.md ./
COPY scripts/setup.sh scripts/setup.sh
COPY lens_ebpf/ lens_ebpf/
COPY bpf_programs/ bpf_programs/
COPY policies/ policies/

# The same install script the README's commands run (scripts/setup.sh).
RUN scripts/setup.sh image

ENV PATH=/opt/lens-ebpf/.venv/bin:$PATH \
    PYTHONUNBUFFERED=1
EXPOSE 9470
ENTRYPOINT ["lens-ebpf"]
CMD ["run"]
