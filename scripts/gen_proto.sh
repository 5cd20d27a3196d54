#!/usr/bin/env bash
# Regenerate traffic/traces/chakra_et_pb2.py and its typing stub chakra_et_pb2.pyi from
# traffic/traces/chakra_et.proto, with the protoc that grpcio-tools ships (`python -m grpc_tools.protoc`).
#
#   scripts/gen_proto.sh            writes next to the .proto (commit the result)
#   scripts/gen_proto.sh OUT_DIR    writes OUT_DIR/traffic/traces/chakra_et_pb2.py(i) instead (the test uses this)
#
# PYTHON selects the interpreter (default: the repository's .venv). The output depends on the
# grpcio-tools version, so the committed files must be regenerated when that pin changes.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root}"
python="${PYTHON:-$root/.venv/bin/python}"
mkdir -p "$out"
cd "$root"
"$python" -m grpc_tools.protoc -I . --python_out="$out" --pyi_out="$out" traffic/traces/chakra_et.proto
