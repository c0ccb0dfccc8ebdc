#!/usr/bin/env bash
# Regenerates kserve_inference_pb2.py / kserve_inference_pb2_grpc.py from kserve_inference.proto.
# Needs grpcio-tools (pip install grpcio-tools). Run from anywhere; the generated files are committed.
set -euo pipefail
cd "$(dirname "$0")"
python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. kserve_inference.proto
# grpc_tools writes an absolute import of the message module; make it relative to this package.
sed -i 's/^import kserve_inference_pb2 as/from . import kserve_inference_pb2 as/' kserve_inference_pb2_grpc.py
