#!/usr/bin/env bash
# Install Debian's docker-compose, which tests/unit/deploy/test_compose.py runs as
# `docker-compose config` to validate docker-compose.yml. Bookworm's package is Compose v1
# (1.29, Python): `config` parses, interpolates and validates the file against the Compose
# schema without a Docker engine. --no-install-recommends keeps the engine (docker.io, a
# recommendation) out: nothing here runs containers. Runs as root on Debian; elsewhere it says
# what is missing and the test skips with that reason.
set -euo pipefail
if command -v docker-compose >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "setup-deploy-tools: docker-compose is missing; install Debian's package (as root) to validate docker-compose.yml" >&2
  exit 0
fi
echo "setup-deploy-tools: installing docker-compose"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose >/dev/null
