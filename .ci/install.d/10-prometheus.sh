#!/usr/bin/env bash
# A real Prometheus (server and promtool) for the integration tests and rule tests.
set -euo pipefail
if ! command -v promtool >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null
fi
# The Debian package starts a system service on :9090; tests run their own on free ports.
if command -v systemctl >/dev/null 2>&1; then systemctl stop prometheus >/dev/null 2>&1 || true; fi
pkill -x prometheus >/dev/null 2>&1 || true
promtool --version | head -1
