#!/usr/bin/env bash
# Regenerate the committed gRPC/protobuf code of the index service from radix_global/proto/*.proto.
# Usage: scripts/gen_proto.sh [python]   (default: .venv/bin/python, which has grpcio-tools)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-.venv/bin/python}"
"$PY" -m grpc_tools.protoc -I . \
  --python_out=. --pyi_out=. --grpc_python_out=. \
  radix_global/proto/index.proto
echo "generated: $(ls radix_global/proto/index_pb2*.py*)"
