#!/bin/bash
# A parallel job (qsub -pe mpi 2) that starts a second task with `qrsh -inherit`, as MPI
# launchers do. No prolog runs for that task: gecod put its shepherd into the job's
# cgroups when sge_execd started it (the exec() preload asked first).
. ./report.sh
report
echo "  starting a task with qrsh -inherit $HOSTNAME ..."
qrsh -inherit "$HOSTNAME" /bin/bash "$PWD/task.sh"
