# Two images from one file, each installed by scripts/setup.sh:
#   docker build --target agent   -t lens-ebpf:0.1.0 .          the node agent (DaemonSet)
#   docker build --target recorder -t lens-ebpf-recorder:0.1.0 .  the recorder
# The agent: Debian 12 with python3-bpfcc, run privileged. Kernel headers come from the
# host (/lib/modules, /usr/src mounted by deploy/); the image carries Debian's
# linux-headers-amd64 as the fallback the agent links in (another kernel's headers are
# safe: tracepoint fields and probe arguments only). The recorder: Python and
# its database drivers, no BCC and no headers.
FROM debian:bookworm-20241111-slim AS source

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /opt/lens-ebpf

COPY pyproject.toml README.md ./
COPY scripts/setup.sh scripts/setup.sh
COPY lens_ebpf/ lens_ebpf/

ENV PATH=/opt/lens-ebpf/.venv/bin:$PATH \
    PYTHONUNBUFFERED=1
ENTRYPOINT ["lens-ebpf"]

FROM source AS recorder
RUN scripts/setup.sh recorder-image
EXPOSE 9480 9472
USER 65534
CMD ["recorder"]

FROM source AS agent
RUN scripts/setup.sh image
EXPOSE 9470
CMD ["run"]
