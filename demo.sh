#!/usr/bin/env bash
# demo.sh -- geco on one fresh Debian 12 machine, as root, from nothing:
#
#   1. scripts/install.sh        packages, geco's Debian package (hooks in /usr/libexec/geco)
#   2. gecod, the quarantine daemon, then integration/sge/setup.sh: a single-host Grid
#      Engine whose sge_execd runs with geco's exec() preload (every job's shepherd is put
#      into the job's cgroups before it runs; gecod ends the job when the shepherd exits)
#      and whose queue runs geco's starter_method
#   3. as the user "gecodemo", five jobs from integration/demo/:
#        serial   1 slot
#        smp      -pe smp 2            (two cores, one cgroup)
#        array    -t 1-2               (each task its own cgroups)
#        mpi      -pe mpi 2            (a qrsh -inherit task lands in the job's cgroups too)
#        oom      -l m_mem_free=200M   (then uses 400M)
#      each prints, from inside, its cgroups, its allowed CPUs and its memory limit
#   4. waits, then shows each job's output, an interactive qrsh inside its cgroups, how
#      the oom job ended (the owner's message in its .e file, its story from the journal)
#      and what each job used
#
# Grid Engine keeps running afterwards (submit more as gecodemo, e.g.
# `su - gecodemo -c 'qsub -b y -pe smp 2 sleep 60'`); integration/sge/teardown.sh stops it.
#
# Environment: GECO_DEMO_USER (default gecodemo), GECO_DEMO_TIMEOUT (seconds, default 180),
# GECO_DEMO_HOOKS=0 (plain Grid Engine without geco, to compare).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

DEMO_USER=${GECO_DEMO_USER:-gecodemo}
TIMEOUT=${GECO_DEMO_TIMEOUT:-180}
LIBEXEC=/usr/libexec/geco
CLEAN_PATH=/usr/local/bin:/usr/bin:/bin
RUNUSER=$(command -v runuser)

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
[ "$(id -u)" = 0 ] || { echo "demo.sh: run as root (it installs packages and starts Grid Engine)" >&2; exit 1; }

say "installing geco"
./scripts/install.sh

say "making sure journald runs (geco journals every job's story)"
journal_alive() {
  /usr/bin/python3 -c 'import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
sys.exit(s.connect_ex("/run/systemd/journal/socket"))' 2>/dev/null
}
if journal_alive; then
  echo "  journald is running"
else
  # no systemd as PID 1 here: journald runs fine on its own and creates its sockets
  (cd / && env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin setsid /lib/systemd/systemd-journald \
     </dev/null >/dev/null 2>&1 &)
  for _ in $(seq 50); do journal_alive && break; sleep 0.1; done
  journal_alive && echo "  started /lib/systemd/systemd-journald" || echo "  WARNING: no journald"
fi

say "starting gecod (geco's quarantine daemon)"
gecod_serving() {
  /usr/bin/python3 -c 'import socket, sys
s = socket.socket(socket.AF_UNIX)
sys.exit(s.connect_ex("/run/geco/gecod.sock"))' 2>/dev/null
}
if [ "${GECO_DEMO_HOOKS:-1}" = 0 ]; then
  echo "  skipped (GECO_DEMO_HOOKS=0)"
elif gecod_serving; then
  echo "  gecod is running"
else
  # with systemd: systemctl start gecod (conf/gecod.service); here it runs on its own
  (cd / && env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin setsid /usr/bin/geco daemon \
     </dev/null >>/var/log/geco-demo-gecod.log 2>&1 &)
  for _ in $(seq 100); do gecod_serving && break; sleep 0.1; done
  gecod_serving && echo "  started gecod (log: /var/log/geco-demo-gecod.log)" \
    || { echo "  gecod did not start:"; tail -5 /var/log/geco-demo-gecod.log; exit 1; }
fi

say "starting Grid Engine with geco's hooks (and sge_execd with geco's exec() preload)"
hooks=()
if [ "${GECO_DEMO_HOOKS:-1}" = 0 ]; then
  echo "GECO_DEMO_HOOKS=0: plain Grid Engine, for comparison"
else
# with the preload, gecod contains each job at its shepherd's exec and ends it when the
# shepherd exits: the queue needs geco's starter only (no prolog or epilog, which Son of
# Grid Engine 8.1.9 kills for interactive jobs with a pty); without it, all three hooks
[ -x "$LIBEXEC/starter" ] && hooks+=(GECO_STARTER="$LIBEXEC/starter")
if [ -r /usr/lib/geco/libgeco_preload.so ]; then
  hooks+=(GECO_EXECD_PRELOAD=/usr/lib/geco/libgeco_preload.so)
else
  [ -x "$LIBEXEC/prolog" ] && hooks+=(GECO_PROLOG="root@$LIBEXEC/prolog \$job_id \$ja_task_id")
  [ -x "$LIBEXEC/epilog" ] && hooks+=(GECO_EPILOG="root@$LIBEXEC/epilog \$job_id \$ja_task_id")
fi
if [ ${#hooks[@]} -lt 2 ]; then
  echo "WARNING: geco's package is not installed: the jobs below run with only plain Grid Engine"
fi
fi
env "${hooks[@]}" SGE_TEST_USER="$DEMO_USER" integration/sge/setup.sh

home=$(getent passwd "$DEMO_USER" | cut -d: -f6)
dir=$(runuser -u "$DEMO_USER" -- mktemp -d "$home/geco-demo.XXXXXX")
install -m 0644 -o "$DEMO_USER" integration/demo/*.sh "$dir/"

# Submit as the demo user from the demo directory, with nothing of root's environment.
submit() { # name qsub-args... script
  local name=$1 out; shift
  out=$(cd "$dir" && env -i PATH="$CLEAN_PATH" LANG=C.UTF-8 \
        "$RUNUSER" -u "$DEMO_USER" -- qsub -cwd -N "$name" "$@")
  [[ "$out" =~ Your\ job(-array)?\ ([0-9]+) ]] || { echo "qsub failed: $out" >&2; exit 1; }
  JOBS[$name]=${BASH_REMATCH[2]}
  printf '  %-7s job %-5s qsub -cwd -N %s %s\n' "$name" "${JOBS[$name]}" "$name" "$*"
}
declare -A JOBS
declare -a ORDER=(serial smp array mpi oom)
say "submitting as $DEMO_USER from $dir"
submit serial serial.sh
submit smp -pe smp 2 smp.sh
submit array -t 1-2 array.sh
submit mpi -pe mpi 2 mpi.sh
submit oom -l m_mem_free=200M oom.sh

say "waiting for the jobs (up to ${TIMEOUT}s)"
# a failing prolog/epilog puts the queue into error state E: then nothing runs anymore
queue_in_error() { qstat -f | awk '$1 ~ /@/ && $6 ~ /E/ { found = 1 } END { exit !found }'; }
end=$(( $(date +%s) + TIMEOUT ))
for name in "${ORDER[@]}"; do
  job=${JOBS[$name]}
  while qstat -j "$job" >/dev/null 2>&1; do
    if queue_in_error || [ "$(date +%s)" -ge "$end" ]; then
      echo "  $name (job $job) has not finished; qstat -j $job says:"
      qstat -j "$job" | grep -E -A1 'error reason|scheduling info' | sed 's/^/    /'
      break
    fi
    sleep 0.5
  done
done
if queue_in_error; then
  echo "  ERROR: the queue is in error state E (a hook failed):"
  qstat -f -explain E | grep -E '@|error' | sed 's/^/    /'
fi

show() { # file
  [ -s "$1" ] || return 0
  echo "--- $(basename "$1")"
  sed 's/^/  /' "$1"
}
for name in "${ORDER[@]}"; do
  job=${JOBS[$name]}
  say "$name (job $job)"
  for f in "$dir/$name.o$job" "$dir/$name.o$job".*; do [ -e "$f" ] && show "$f"; done
  for f in "$dir/$name.e$job" "$dir/$name.e$job".*; do [ -e "$f" ] && show "$f"; done
done

say "an interactive job: qrsh, as $DEMO_USER"
if (cd "$dir" && env -i PATH="$CLEAN_PATH" LANG=C.UTF-8 "$RUNUSER" -u "$DEMO_USER" -- \
      timeout 60 qrsh -now n -N qrsh \
      'echo "  job $JOB_ID: cgroup $(grep cpuset /proc/self/cgroup | cut -d: -f3), cores $(grep Cpus_allowed_list /proc/self/status | cut -f2)"' \
      </dev/null); then :; else echo "  qrsh failed (exit $?)"; fi

say "how the oom job ended (qacct -j ${JOBS[oom]})"
if qacct -j "${JOBS[oom]}" >"$dir/oom.qacct" 2>&1; then
  grep -E '^(failed|exit_status|maxvmem|ru_maxrss)' "$dir/oom.qacct" | sed 's/^/  /'
  status=$(awk '$1 == "exit_status" {print $2}' "$dir/oom.qacct")
  case "$status" in
    0) echo "  exit status 0: it used 400M undisturbed: no memory limit held it to its 200M" ;;
    137) echo "  exit status 137 = killed by SIGKILL: the kernel OOM-killed it at its memory limit" ;;
    *) echo "  exit status $status" ;;
  esac
else
  echo "  qacct has no record yet:"; sed 's/^/  /' "$dir/oom.qacct"
fi
if journal_alive; then
  journalctl --sync 2>/dev/null || true
  echo "  geco's side of the story (geco journal ${JOBS[oom]}; journalctl JOB_ID=${JOBS[oom]} has every field):"
  /usr/bin/geco journal "${JOBS[oom]}" | sed 's/^/    /' || true

  say "what each job used (its job-end accounting, from geco journal)"
  for name in "${ORDER[@]}"; do
    /usr/bin/geco journal "${JOBS[$name]}" 2>&1 | grep -E '^job [0-9.]+( ended|: no job-end)' \
      | sed "s/^/  $name: /" || echo "  $name: no journal entries"
  done
fi

say "done"
echo "job files: $dir"
echo "Grid Engine keeps running; stop it with: integration/sge/teardown.sh"
