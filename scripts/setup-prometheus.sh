#!/usr/bin/env bash
# Install Debian's prometheus, which tests/integration/test_admin_metrics.py and
# test_deploy_dashboards.py run against a live cluster. Runs as root on Debian (where those
# tests then fail without it); elsewhere it says what is missing and the tests skip.
set -euo pipefail
if command -v prometheus >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "setup-prometheus: prometheus is missing; install Debian's package (as root) to run its test" >&2
  exit 0
fi
echo "setup-prometheus: installing prometheus"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
# The package starts a system service where systemd runs; the test starts its own instance.
