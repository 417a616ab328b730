#!/usr/bin/env bash
# Make a headless Chromium available (`make browser`, run by `make test`); idempotent.
#   - `chromium` (or $DAY0_CHROMIUM) already runs: nothing is installed.
#   - otherwise installs Debian's chromium package (root only; `apt-get update` only when the
#     package lists lack it). tests/test_ui.py drives it against a real Prefect UI.
# Exits non-zero with a reason when none can be had: CI must never skip the browser test.
set -euo pipefail
LOG=${DAY0_APT_LOG:-/tmp/day0-apt-chromium.log}

die() { printf 'browser: %s\n' "$*" >&2; exit 1; }

found() {
  local bin
  for bin in "${DAY0_CHROMIUM:-}" chromium chromium-browser; do
    [ -n "$bin" ] && command -v "$bin" >/dev/null && { command -v "$bin"; return 0; }
  done
  return 1
}

if bin=$(found); then
  echo "browser: $("$bin" --version 2>/dev/null || echo "$bin")"
  exit 0
fi
[ "$(id -u)" = 0 ] || die "need root to install chromium (apt-get); install it yourself or run as root"
export DEBIAN_FRONTEND=noninteractive
echo "browser: installing chromium (Debian; log: $LOG)"
if ! apt-get install -o DPkg::Lock::Timeout=600 -y -q --no-install-recommends chromium >"$LOG" 2>&1; then
  apt-get -o DPkg::Lock::Timeout=600 update -q >>"$LOG" 2>&1 || true
  apt-get install -o DPkg::Lock::Timeout=600 -y -q --no-install-recommends chromium >>"$LOG" 2>&1 \
    || { tail -20 "$LOG" >&2; die "apt-get install chromium failed (log: $LOG)"; }
fi
bin=$(found) || die "no chromium binary after installing the package"
echo "browser: $("$bin" --version 2>/dev/null || echo "$bin")"
