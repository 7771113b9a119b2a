#!/usr/bin/env bash
# Regenerate lens_ebpf/api/gen from protos/ (make protos). Tests check for drift.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-lens_ebpf/api/gen}
mkdir -p "$out"
.venv/bin/python -m grpc_tools.protoc -Iprotos/lens/v1 --python_out="$out" --pyi_out="$out" \
  --grpc_python_out="$out" protos/lens/v1/lens.proto
# protoc writes an absolute import; the package needs a relative one
sed -i 's/^import lens_pb2 as lens__pb2$/from . import lens_pb2 as lens__pb2/' "$out/lens_pb2_grpc.py"
