#!/usr/bin/env bash
# test.sh [pytest args] -- geco's test suite, as CI runs it (root, Debian 12).
#
#   ./test.sh                                   everything under tests/
#   ./test.sh tests/integration/test_sge_smoke.py -x
#
# 1. scripts/install.sh --test: packages (qemu for the VM tests included), geco's package built and
#    installed, /opt/geco-dev/venv with pytest, ruff and mypy (fast when done)
# 2. ruff check and mypy (strict, from pyproject.toml)
# 3. pytest with the venv's python; its fixtures start journald and Grid Engine
#
# Exit status: pytest's (5 = no tests collected counts as failure), else 1 if lint or
# types failed. Lint findings do not stop the tests: one run reports everything.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

./scripts/install.sh --test

BIN=/opt/geco-dev/venv/bin
lint=0
echo "== ruff check"
"$BIN/ruff" check . || lint=1
echo "== mypy"
"$BIN/mypy" || lint=1

echo "== pytest"
rc=0
"$BIN/python" -m pytest "$@" || rc=$?
if [ "$rc" -eq 0 ] && [ "$lint" -ne 0 ]; then
  echo "tests passed, but ruff or mypy reported findings (above)" >&2
  rc=1
fi
exit "$rc"
