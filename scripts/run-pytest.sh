#!/usr/bin/env bash
# Run pytest; "no tests collected" (exit 5) is a failure here too, with a clear message.
set -uo pipefail
cd "$(dirname "$0")/.."
.venv/bin/pytest "$@"
code=$?
if [ "$code" -eq 5 ]; then
  echo "run-pytest: no tests were collected; treating that as a failure" >&2
  exit 1
fi
exit "$code"
