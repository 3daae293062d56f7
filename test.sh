#!/usr/bin/env bash
# test.sh [pytest args] -- geco's test suite, as CI runs it (root, Debian 12).
#
#   ./test.sh                                   everything under tests/
#   ./test.sh tests/integration/test_sge_smoke.py -x
#
# 1. scripts/install.sh --test: packages (qemu for the VM tests included), geco's package built and
#    installed, /opt/geco-dev/venv with pytest, ruff and mypy (fast when done)
# 2. ruff check and mypy (strict, from pyproject.toml)
# 3. pytest with the venv's python; its fixtures start journald and Grid Engine. The whole
#    suite (no arguments) runs in two pytest sessions side by side: the tests of tests/unit
#    and tests/fuzz that need none of the node's services (CPU-bound, ~2 minutes; see
#    GECO_TEST_LANE in tests/conftest.py) beside the rest, which mostly waits on Grid
#    Engine; their output follows the rest's
#
# Exit status: pytest's (5 = no tests collected counts as failure; with two sessions, the
# first that failed), else 1 if lint or types failed. Lint findings do not stop the tests:
# one run reports everything.
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
if [ $# -eq 0 ]; then
  # the side session: no cache (the main one keeps pytest's), its output kept for the end
  side_log=$(mktemp /tmp/geco-tests-side.XXXXXX)
  GECO_TEST_LANE=side "$BIN/python" -m pytest -p no:cacheprovider tests/unit tests/fuzz \
    > "$side_log" 2>&1 &
  side=$!
  # (|| true: under set -e a failing command in the trap, the kill of a session already
  # ended, would make the script's own exit status 1)
  trap 'kill "$side" 2>/dev/null || true; rm -f "$side_log"' EXIT
  GECO_TEST_LANE=main "$BIN/python" -m pytest || rc=$?
  side_rc=0
  wait "$side" || side_rc=$?
  echo "== pytest tests/unit tests/fuzz (run beside the above)"
  cat "$side_log"
  if [ "$rc" -eq 0 ]; then rc=$side_rc; fi
else
  "$BIN/python" -m pytest "$@" || rc=$?
fi
if [ "$rc" -eq 0 ] && [ "$lint" -ne 0 ]; then
  echo "tests passed, but ruff or mypy reported findings (above)" >&2
  rc=1
fi
exit "$rc"
