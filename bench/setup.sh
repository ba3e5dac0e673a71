#!/usr/bin/env bash
# Install what bench/run.sh needs (Debian/Ubuntu, as root): nginx with the lua
# module (mock backend and the nginx reverse-proxy baseline) and wrk (load
# generator); and, where Debian has it, BOLT (bolt-16, for bench/bolt.sh only).
# Idempotent: does nothing when everything is already there.
# It never starts the system nginx service; run.sh starts its own instances.
set -euo pipefail
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
# BOLT is for bench/bolt.sh alone: a release without the package is still set up.
have_bolt() { command -v llvm-bolt >/dev/null 2>&1 || [ -x /usr/lib/llvm-16/bin/llvm-bolt ]; }
bolt() {
  have_bolt || $SUDO apt-get install -y bolt-16 \
    || echo "setup: bolt-16 is not available here; bench/bolt.sh needs llvm-bolt (BOLT=path)" >&2
}
have_all() {
  command -v nginx >/dev/null 2>&1 && command -v wrk >/dev/null 2>&1 &&
    [ -f /usr/lib/nginx/modules/ngx_http_lua_module.so ] &&
    [ -f /usr/lib/nginx/modules/ndk_http_module.so ] &&
    command -v curl >/dev/null 2>&1 && command -v python3 >/dev/null 2>&1 &&
    command -v ss >/dev/null 2>&1
}
if have_all; then
  echo "setup: nginx, libnginx-mod-http-lua, wrk, curl, python3, ss already installed"
  have_bolt || { $SUDO apt-get update && bolt; }
  exit 0
fi
$SUDO apt-get update
$SUDO apt-get install -y nginx libnginx-mod-http-lua wrk curl python3 iproute2
bolt
# Debian normally does not start services inside containers; if the package
# started the system nginx, it is left alone (run.sh uses ports 18080/18081 only).
have_all || { echo "setup: something is still missing" >&2; exit 1; }
echo "setup: done ($(nginx -v 2>&1); $(wrk -v 2>&1 | head -1))"
