#!/bin/bash
# A 2-slot job on one host (qsub -pe smp 2): two cores, one cgroup for both.
. ./report.sh
report
echo "  python3 sees: os.sched_getaffinity(0) = $(python3 -c 'import os; print(sorted(os.sched_getaffinity(0)))')"
