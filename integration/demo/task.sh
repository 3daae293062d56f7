#!/bin/bash
# The qrsh -inherit task of mpi.sh: where does it run?
cd "$(dirname "$0")" && . ./report.sh
echo "  -- the qrsh -inherit task (pid $$):"
grep -E '^[0-9]+:([^:]*,)?(cpuset|memory)(,[^:]*)?:' /proc/$$/cgroup | sed 's/^/      /'
echo "     allowed CPUs: $(awk '/^Cpus_allowed_list/ {print $2}' /proc/$$/status)"
