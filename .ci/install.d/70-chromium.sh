#!/usr/bin/env bash
# Debian's headless Chromium for the console's browser tests (driven by Playwright with its
# executable path; Playwright's own browser download is not used).
set -euo pipefail
if ! command -v chromium >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
chromium --version
