#!/usr/bin/env bash
# Runs pytest; "no tests collected" (exit 5) is an error here, never a silent pass.
set -uo pipefail
"${VENV:-.venv}/bin/pytest" "$@"
code=$?
if [ "$code" -eq 5 ]; then
  echo "pytest collected no tests: failing on purpose" >&2
  exit 1
fi
exit "$code"
