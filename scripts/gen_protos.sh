#!/usr/bin/env bash
# Regenerate the gRPC code from protos/ (make protos): lens_ebpf/protocol/gen (our event API),
# lens_ebpf/k8s/gen (the kubelet's PodResources v1, and its device plugin API v1beta1 that
# the test device plugin speaks) and lens_ebpf/recorder/gen (Prometheus remote write 1.0
# and 2.0, messages only). Tests check for drift.
# With an argument DIR, writes DIR/api, DIR/k8s and DIR/cluster instead.
set -euo pipefail
cd "$(dirname "$0")/.."
api=${1:+$1/api}
k8s=${1:+$1/k8s}
cluster=${1:+$1/cluster}
api=${api:-lens_ebpf/protocol/gen}
k8s=${k8s:-lens_ebpf/k8s/gen}
cluster=${cluster:-lens_ebpf/recorder/gen}
gen() {  # gen OUT PROTO_DIR NAME
  mkdir -p "$1"
  .venv/bin/python -m grpc_tools.protoc -I"$2" --python_out="$1" --pyi_out="$1" \
    --grpc_python_out="$1" "$2/$3.proto"
  # protoc writes an absolute import; the package needs a relative one
  sed -i "s/^import $3_pb2 as /from . import $3_pb2 as /" "$1/$3_pb2_grpc.py"
}
gen "$api" protos/lens/v1 lens
gen "$api" protos/lens/v1 deepdive  # the deep-dive calls (agent/deepdive)
gen "$api" protos/lens/v1 profiler  # the profiler-file calls (agent/profiler)
gen "$k8s" protos/k8s/podresources/v1 podresources_v1
gen "$k8s" protos/k8s/deviceplugin/v1beta1 deviceplugin_v1beta1
messages() {  # messages OUT PROTO_DIR NAME: no service, no gRPC code
  mkdir -p "$1"
  .venv/bin/python -m grpc_tools.protoc -I"$2" --python_out="$1" --pyi_out="$1" "$2/$3.proto"
}
messages "$cluster" protos/prometheus/v1 remote_write_v1
messages "$cluster" protos/prometheus/v2 remote_write_v2
