#!/usr/bin/env bash
# Install what the lab tests need (DESIGN section 9): iproute2 (ip netns) and iptables.
# Runs as root on Debian; elsewhere it says what is missing and leaves the tests to report it.
set -euo pipefail
missing=()
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v iptables >/dev/null 2>&1 || missing+=(iptables)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "setup-lab: missing ${missing[*]}; install them (as root) to run the lab tests" >&2
  exit 0
fi
echo "setup-lab: installing ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
