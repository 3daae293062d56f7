#!/bin/bash
# One task of an array job (qsub -t 1-2): every task gets cgroups of its own.
. ./report.sh
report
