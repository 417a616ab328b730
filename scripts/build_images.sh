#!/usr/bin/env bash
# Build day0's Docker images locally, without pulling anything from a registry (`make images`):
#   1. day0/base:bookworm - a Debian bookworm rootfs (python3, venv, pip) made by debootstrap and
#      `docker import`ed. Skipped when the image exists; the rootfs tarball is cached under
#      ${XDG_CACHE_HOME:-~/.cache}/day0/docker/ so a wiped engine re-imports instead of re-bootstrapping.
#   2. build/wheelhouse/ - wheels of day0's dependencies (CPU torch 2.13.0 only), resolved by pip
#      inside the base image (its Python decides environment markers), with the host's pip cache and
#      find-links mounted. Skipped while the dependencies and the base image are unchanged; a
#      clean clone takes this machine's last resolved set for the same key from
#      ${XDG_CACHE_HOME:-~/.cache}/day0/docker/wheelhouse-<key>/ (the same bytes: the image's
#      dependency layer stays in Docker's cache instead of reinstalling 440 MB of wheels).
#   3. day0:local - `docker build` of the project Dockerfile from the wheelhouse (no index).
# Needs a running engine: scripts/docker_engine.sh (`make docker-engine`).
#
# Environment:
#   DAY0_IMAGE       tag of the day0 image          (day0:local)
#   DAY0_BASE_IMAGE  tag of the base image          (day0/base:bookworm)
#   DEBIAN_MIRROR    debootstrap mirror             (http://deb.debian.org/debian)
#   TORCH_INDEX      extra index for the CPU torch wheel (https://download.pytorch.org/whl/cpu);
#                    local wheels in $PIP_FIND_LINKS / pip's find-links (e.g. /opt/wheels) come first
#   VENV             the project venv whose pip config and cache are reused (.venv)
#   FORCE_WHEELHOUSE=1  rebuild the wheelhouse even if the stamp matches
# Usage: scripts/build_images.sh [base]     (`base`: only step 1)
set -euo pipefail
cd "$(dirname "$0")/.."
ONLY=${1:-all}
ROOT=$PWD
IMAGE=${DAY0_IMAGE:-day0:local}
BASE=${DAY0_BASE_IMAGE:-day0/base:bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
TORCH_INDEX=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
TORCH_PIN="torch==2.13.0+cpu"
# uv's wheel rides in the wheelhouse: the Dockerfile installs the dependency layer with it
UV_PIN=$(sed -n 's/^UV = "\(.*\)"$/\1/p' scripts/pip_install.py)
VENV=${VENV:-.venv}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/day0/docker
WHEELS=build/wheelhouse
export DOCKER_BUILDKIT=0   # the legacy builder: no buildx on these machines

log()  { printf '\n=== %s\n' "$*"; }
die()  { printf 'build_images: %s\n' "$*" >&2; exit 1; }
step_start() { STEP_T0=$(date +%s.%N); }
since()      { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
step_end()   { TIMINGS+=("$(printf '%-34s %6s s' "$1" "$(since "$STEP_T0")")"); }
TIMINGS=()
T_ALL=$(date +%s.%N)

docker info >/dev/null 2>&1 || die "no Docker engine answers; run scripts/docker_engine.sh (make docker-engine) first"

# ---- 1. base image ---------------------------------------------------------------------------
step_start
mkdir -p "$CACHE"
tarball=$CACHE/base-bookworm-rootfs.tar
if docker image inspect "$BASE" >/dev/null 2>&1; then
  log "base image $BASE present"
  if [ ! -s "$tarball" ]; then   # keep a copy, so a wiped engine re-imports instead of re-bootstrapping
    cid=$(docker create "$BASE" true)
    docker export "$cid" > "$tarball.part" && mv "$tarball.part" "$tarball"
    docker rm "$cid" >/dev/null
    echo "rootfs saved to $tarball"
  fi
else
  if [ ! -s "$tarball" ]; then
    log "debootstrap bookworm -> $tarball (about a minute)"
    [ "$(id -u)" = 0 ] || die "debootstrap needs root (or import a rootfs tarball to $tarball)"
    command -v debootstrap >/dev/null || die "debootstrap missing; scripts/docker_engine.sh installs it"
    rootfs=$(mktemp -d /tmp/day0-rootfs.XXXXXX)
    trap 'rm -rf "$rootfs"' EXIT
    debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
      bookworm "$rootfs" "$MIRROR" > "$CACHE/debootstrap.log" 2>&1 \
      || { tail -20 "$CACHE/debootstrap.log" >&2; die "debootstrap failed (log: $CACHE/debootstrap.log)"; }
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/tmp/* || true
    tar --numeric-owner -C "$rootfs" -cf "$tarball.part" . && mv "$tarball.part" "$tarball"
    rm -rf "$rootfs"; trap - EXIT
  else
    log "re-importing cached rootfs $tarball"
  fi
  docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    "$tarball" "$BASE" >/dev/null
fi
docker run --rm --network none "$BASE" python3 -c 'import sys, venv, ensurepip; print("base python", sys.version.split()[0])'
step_end "base image ($BASE)"

[ "$ONLY" = base ] && { printf '  %s\n' "${TIMINGS[@]}"; exit 0; }

# ---- 2. wheelhouse ---------------------------------------------------------------------------
step_start
base_id=$(docker image inspect --format '{{.Id}}' "$BASE")
# keyed on the runtime dependencies only: test extras and tool settings do not enter the image
deps=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"])')
stamp_key=$( { echo "$deps"; echo "$TORCH_PIN $UV_PIN $base_id"; } | sha256sum | cut -c1-16)
stamp=build/wheelhouse.stamp
kept="$CACHE/wheelhouse-$stamp_key"  # this machine's resolved set for the key (any clone)
if [ "${FORCE_WHEELHOUSE:-0}" != 1 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$stamp_key" ] \
   && ls "$WHEELS"/torch-*.whl >/dev/null 2>&1; then
  log "wheelhouse up to date ($(ls "$WHEELS"/*.whl | wc -l) wheels)"
elif [ "${FORCE_WHEELHOUSE:-0}" != 1 ] && [ -f "$kept/.complete" ]; then
  # Re-resolving would pick newer releases of unpinned dependencies and rebuild sdists (new
  # bytes): Docker's dependency layer would be rebuilt on every clean clone.
  log "wheelhouse: this machine's set for these dependencies ($kept)"
  mkdir -p "$WHEELS"
  find "$WHEELS" -maxdepth 1 -name '*.whl' -delete
  cp -l "$kept"/*.whl "$WHEELS"/ 2>/dev/null || cp "$kept"/*.whl "$WHEELS"/
  echo "$stamp_key" > "$stamp"
  echo "$(ls "$WHEELS"/*.whl | wc -l) wheels, $(du -sh "$WHEELS" | cut -f1)"
else
  log "wheelhouse: resolving day0's dependencies for the base image's Python"
  [ -x "$VENV/bin/python" ] || die "$VENV missing; run make install first"
  pip_cache=$("$VENV/bin/python" -m pip cache dir 2>/dev/null || echo "$HOME/.cache/pip")
  mkdir -p "$pip_cache" build
  # find-links of the host's pip config (e.g. /opt/wheels with the CPU torch wheel) are mounted.
  find_links=$("$VENV/bin/python" -m pip config list 2>/dev/null | sed -n "s/.*find-links='\(.*\)'/\1/p" | tr ' \n' '  ')
  find_links="$find_links ${PIP_FIND_LINKS:-}"
  mounts=() ; fl_args=()
  for d in $find_links; do
    d=${d#file://}
    [ -d "$d" ] || continue
    mounts+=(-v "$d:$d:ro"); fl_args+=(--find-links "$d")
  done
  # The CPU torch wheel: from a local find-links folder when one holds it, else from TORCH_INDEX.
  index_args=(--extra-index-url "$TORCH_INDEX")
  for d in $find_links; do
    if ls "${d#file://}"/torch-2.13.0+cpu-*.whl >/dev/null 2>&1; then index_args=(); fi
  done
  # The host's CA bundle (pip's `cert`, e.g. a TLS-inspecting proxy's CA) is trusted in the container too.
  cert=${PIP_CERT:-$("$VENV/bin/python" -m pip config get global.cert 2>/dev/null || true)}
  if [ -n "$cert" ] && [ -f "$cert" ]; then mounts+=(-v "$cert:/etc/day0-host-ca.crt:ro" -e PIP_CERT=/etc/day0-host-ca.crt); fi
  "$VENV/bin/python" - > build/requirements-image.txt <<'EOF'
import tomllib
for dep in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]:
    print(dep)
EOF
  new=$(mktemp -d "$ROOT/build/wheelhouse.new.XXXXXX")
  trap 'rm -rf "$new"' EXIT
  docker run --rm --network host --user "$(id -u):$(id -g)" -e HOME=/tmp \
    -e PIP_CACHE_DIR=/pip-cache -e PIP_DISABLE_PIP_VERSION_CHECK=1 -e PIP_DEFAULT_TIMEOUT=180 \
    -v "$pip_cache:/pip-cache" -v "$ROOT/build:/build" -v "$new:/out" "${mounts[@]}" \
    "$BASE" python3 -m pip wheel --quiet --wheel-dir /out "${fl_args[@]}" \
      "${index_args[@]}" \
      "$TORCH_PIN" -r /build/requirements-image.txt "setuptools>=68" wheel "$UV_PIN" \
    || die "pip wheel failed"
  # CPU torch only: a CUDA build (or its nvidia-* / triton wheels) must never reach the image.
  ls "$new"/torch-2.13.0+cpu-*.whl >/dev/null 2>&1 || die "no torch-2.13.0+cpu wheel in the wheelhouse"
  if ls "$new" | grep -Eqi '^(nvidia|triton|cuda)'; then die "CUDA wheels in the wheelhouse: $(ls "$new" | grep -Ei '^(nvidia|triton|cuda)' | tr '\n' ' ')"; fi
  # Swap in the exact new set (identical wheels keep Docker's COPY cache: mtimes do not count).
  mkdir -p "$WHEELS"
  find "$WHEELS" -maxdepth 1 -name '*.whl' -delete
  mv "$new"/*.whl "$WHEELS"/
  rm -rf "$new"; trap - EXIT
  echo "$stamp_key" > "$stamp"
  echo "$(ls "$WHEELS"/*.whl | wc -l) wheels, $(du -sh "$WHEELS" | cut -f1)"
  # kept for the next clone of this machine; only the latest key (440 MB each)
  rm -rf "$CACHE"/wheelhouse-*
  mkdir -p "$kept" && cp "$WHEELS"/*.whl "$kept"/ && touch "$kept/.complete"
fi
step_end "wheelhouse (build/wheelhouse)"

# ---- 3. day0 image ---------------------------------------------------------------------------
step_start
log "docker build -> $IMAGE"
rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
docker build --network host \
  --build-arg BASE_IMAGE="$BASE" \
  --build-arg VCS_REF="$rev" \
  -t "$IMAGE" . > build/docker-build.log 2>&1 \
  || { tail -40 build/docker-build.log >&2; die "docker build failed (log: build/docker-build.log)"; }
awk '/^Step /{n++} /Using cache/{c++} END{printf "  %d of %d Dockerfile steps from the layer cache\n", c, n}' build/docker-build.log
step_end "docker build ($IMAGE)"

# ---- smoke check -----------------------------------------------------------------------------
step_start
docker run --rm --network none "$IMAGE" python -c \
  "import day0, torch; assert torch.version.cuda is None; print('day0 image ok: torch', torch.__version__)"
step_end "smoke run"

log "timings"
printf '  %s\n' "${TIMINGS[@]}"
printf '  %-34s %6s s\n' "total" "$(since "$T_ALL")"
docker image ls --format '  {{.Repository}}:{{.Tag}}  {{.ID}}  {{.Size}}' | grep -E "^  ($IMAGE|$BASE) " || true
