#!/usr/bin/env bash
# System packages the test suite needs beyond Python (run as root in CI, Debian/Ubuntu).
#   chromium: headless browser for tests/web (the dashboard is checked in a real browser)
# Tests that need one of these skip with the reason when it is absent.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
if command -v chromium >/dev/null 2>&1; then
  echo "chromium already installed: $(chromium --version 2>/dev/null || echo '?')"
  exit 0
fi
apt-get update -q
apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core
