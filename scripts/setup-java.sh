#!/usr/bin/env bash
# A Java runtime (17 or later) for PySpark 4, which the pipeline tests start
# (tests/integration/test_pipeline.py, tests/unit/pipeline). Runs as root on Debian; elsewhere it
# says what is missing and those tests skip with that reason.
set -euo pipefail
java_major() {
  # `java -version` prints 'openjdk version "17.0.15" ...' (or "1.8.0_x" before Java 9).
  java -version 2>&1 | sed -n 's/.*version "\([0-9]*\)[.".].*/\1/p' | head -n 1
}
if command -v java >/dev/null 2>&1 && [ "$(java_major)" -ge 17 ] 2>/dev/null; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "setup-java: Java 17+ is missing; install a JRE (as root: apt-get install default-jre-headless) to run the pipeline tests" >&2
  exit 0
fi
echo "setup-java: installing Debian's default JRE (headless)"
apt-get update -qq
# man pages are excluded in slim images, and the JRE's postinst links into them.
mkdir -p /usr/share/man/man1
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends default-jre-headless >/dev/null
if [ "$(java_major)" -lt 17 ] 2>/dev/null; then
  echo "setup-java: Debian's default JRE is Java $(java_major); PySpark 4 needs 17+" >&2
fi
