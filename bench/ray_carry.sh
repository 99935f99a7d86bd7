#!/usr/bin/env bash
# Pack Ray for the device (Python 3.12, torch 2.11, no network, no Ray) into .stage/ray312.tar.xz,
# small enough to travel beside the project (the device call carries 64 MiB in all).
#
#   bench/ray_carry.sh                 # here, with network: writes .stage/ray312.tar.xz
#   # on the device (the one-liner; then `tunedb build --workers N` finds Ray):
#   mkdir -p /tmp/ray312 && tar -xJf .stage/ray312.tar.xz -C /tmp/ray312 && export PYTHONPATH=/tmp/ray312:$PYTHONPATH
#
# What travels: the cp312 manylinux Ray wheel unpacked, minus what measuring actors never load
# (the Java jars, the dashboard's web client, the RLlib/Data/Serve/Train/Tune/LLM libraries,
# tests, __pycache__), plus Ray's hard requirements other than filelock (torch has it): click,
# jsonschema (+ attrs, referencing, rpds-py, jsonschema-specifications), msgpack, packaging,
# protobuf, pyyaml, requests (+ urllib3, idna, certifi, charset-normalizer). Checked here: a bare
# Python 3.12 (pip only) with this on PYTHONPATH plus filelock and typing_extensions (torch brings
# both) starts a local cluster and two num_gpus=1 actors.
# PY / PLATFORM / RAY_VERSION override the target.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PY:-3.12}"
PLATFORM="${PLATFORM:-manylinux2014_x86_64}"
RAY_VERSION="${RAY_VERSION:-2.60.0}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
OUT="$ROOT/.stage/ray312.tar.xz"
mkdir -p "$ROOT/.stage" "$WORK/whl" "$WORK/site"

dl() { pip download --quiet --no-deps --python-version "$PY" --only-binary=:all: --platform "$PLATFORM" -d "$WORK/whl" "$@"; }
dl "ray==$RAY_VERSION"
# pure-Python requirements (any platform) and the binary ones (cp312 manylinux)
dl click jsonschema attrs referencing jsonschema-specifications rpds-py msgpack packaging \
   protobuf pyyaml requests urllib3 idna certifi charset-normalizer

# unpack keeping each file's mode (zipfile -e drops the exec bit Ray's raylet and gcs_server need)
python - "$WORK/site" "$WORK"/whl/*.whl <<'PY'
import os, sys, zipfile
dest = sys.argv[1]
for wheel in sys.argv[2:]:
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            path = z.extract(info, dest)
            mode = (info.external_attr >> 16) & 0o777
            if mode and not info.is_dir():
                os.chmod(path, mode)
PY

R="$WORK/site/ray"
rm -rf "$R/jars" "$R/dashboard/client" "$R/rllib" "$R/data" "$R/serve" "$R/train" "$R/tune" "$R/llm" \
       "$R/cpp" "$R/tests" "$WORK/site/ray/core/src/ray/raylet/"*.debug 2>/dev/null || true
find "$WORK/site" -name __pycache__ -type d -prune -exec rm -rf {} +
find "$WORK/site" -path '*/tests' -type d -prune -exec rm -rf {} +
# the .so files carry symbol tables the actors do not need
if command -v strip >/dev/null; then
  find "$WORK/site" -name '*.so*' -type f -exec strip --strip-unneeded {} + 2>/dev/null || true
  strip --strip-unneeded "$R/core/src/ray/raylet/raylet" "$R/core/src/ray/gcs/gcs_server" 2>/dev/null || true
fi

tar -C "$WORK/site" -cf - . | xz -9 -T0 > "$OUT"
SIZE=$(stat -c %s "$OUT")
echo "$OUT: $((SIZE / 1024 / 1024)) MiB ($SIZE bytes); unpacked $(du -sh "$WORK/site" | cut -f1)"
if [ "$SIZE" -gt $((57 * 1024 * 1024)) ]; then
  echo "warning: over 57 MiB: it may not fit beside the project in one device call" >&2
fi
