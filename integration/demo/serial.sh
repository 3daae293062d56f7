#!/bin/bash
# A serial job (1 slot): it should see one core and its own cgroups.
. ./report.sh
report
