#!/usr/bin/env bash
# teardown.sh -- stop the single-host Grid Engine that integration/sge/setup.sh started.
#
#   teardown.sh              delete all jobs, stop sge_execd and sge_qmaster; packages,
#                            spool and configuration stay (setup.sh restarts in ~5 s)
#   teardown.sh --keep-jobs  stop the daemons, leave running jobs and their shepherds
#   teardown.sh --no-wait    do not wait for sge_qmaster to exit (it takes ~10 s to shut
#                            down); setup.sh waits for it if started again meanwhile.
#                            Jobs and execd are still stopped and waited for.
#   teardown.sh --purge      also purge the gridengine packages, the spool, the cell,
#                            the debconf answers, and restore /etc/hosts
#
# Only the daemon pids recorded in Grid Engine's own pid files are ever signalled.
set -uo pipefail

export PATH=/usr/sbin:/usr/bin:/sbin:/bin
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"  # SGE_ROOT, SGE_CELL, the clients first
SPOOL=/var/spool/gridengine
STOPPING=$SPOOL/qmaster/geco-stopping
KEEP_JOBS=no
PURGE=no
NO_WAIT=no
for a in "$@"; do
  case "$a" in
    --keep-jobs) KEEP_JOBS=yes ;;
    --purge) PURGE=yes ;;
    --no-wait) NO_WAIT=yes ;;
    *) echo "usage: $0 [--keep-jobs] [--no-wait] [--purge]" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "[sge-teardown] ERROR: must run as root" >&2; exit 1; }

# never while setup.sh is configuring the cluster
mkdir -p /run/lock
exec 9>/run/lock/geco-sge-setup.lock
flock 9

T0=$(date +%s%N)
log() { local ms=$(( ($(date +%s%N) - T0) / 1000000 )); printf '[sge-teardown %3d.%01ds] %s\n' $((ms / 1000)) $(((ms % 1000) / 100)) "$*"; }

alive() { [ -n "${1:-}" ] && [ "$(cat "/proc/$1/comm" 2>/dev/null)" = "$2" ]; }
wait_gone() { # pid comm seconds
  local end=$(( $(date +%s) + $3 ))
  while alive "$1" "$2" && [ "$(date +%s)" -lt "$end" ]; do sleep 0.1; done
  ! alive "$1" "$2"
}
stop_pid() { # pid comm graceful-seconds: wait, then TERM, then KILL
  wait_gone "$1" "$2" "$3" && return 0
  log "   $2 (pid $1) still alive after ${3}s: SIGTERM"; kill -TERM "$1" 2>/dev/null
  wait_gone "$1" "$2" 20 && return 0
  log "   $2 (pid $1) still alive: SIGKILL"; kill -KILL "$1" 2>/dev/null
  wait_gone "$1" "$2" 5
}

QM_PID=$(cat "$SPOOL/qmaster/qmaster.pid" 2>/dev/null || true)
alive "$QM_PID" sge_qmaster || QM_PID=

# 1. jobs
if [ -n "$QM_PID" ] && [ "$KEEP_JOBS" = no ] && [ -n "$(qstat -u '*' 2>/dev/null)" ]; then
  log "deleting all jobs"
  qdel -f -u '*' >/dev/null 2>&1 || true
  end=$(( $(date +%s) + 30 ))
  while [ -n "$(qstat -u '*' -s rs 2>/dev/null)" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 0.3; done
fi

# 2. execd(s) of this host (one spool dir per name the host ever had)
for pf in "$SPOOL"/execd/*/execd.pid; do
  [ -e "$pf" ] || continue
  pid=$(cat "$pf" 2>/dev/null || true)
  alive "$pid" sge_execd || continue
  host=$(basename "$(dirname "$pf")")
  log "stopping sge_execd on $host (pid $pid)"
  if [ -z "$QM_PID" ]; then
    kill -TERM "$pid" 2>/dev/null
  elif [ "$KEEP_JOBS" = yes ]; then
    qconf -ke "$host" >/dev/null 2>&1 || kill -TERM "$pid" 2>/dev/null
  else
    # -kej: also kill its jobs (-ke leaves them running)
    qconf -kej "$host" >/dev/null 2>&1 || kill -TERM "$pid" 2>/dev/null
  fi
  stop_pid "$pid" sge_execd 30 && log "   stopped"
done

# 3. qmaster (needs ~10 s to shut down its threads)
if [ -n "$QM_PID" ]; then
  log "stopping sge_qmaster (pid $QM_PID)"
  qconf -km >/dev/null 2>&1 || kill -TERM "$QM_PID" 2>/dev/null
  if [ "$NO_WAIT" = yes ] && [ "$PURGE" = no ]; then
    echo "$QM_PID" > "$STOPPING"
    log "   shutting down in the background"
  else
    stop_pid "$QM_PID" sge_qmaster 60 && log "   stopped" && rm -f "$STOPPING"
  fi
fi

# 4. purge
if [ "$PURGE" = yes ]; then
  log "purging packages, spool and cell"
  DEBIAN_FRONTEND=noninteractive apt-get purge -y -q gridengine-master gridengine-exec \
    gridengine-client gridengine-common >/dev/null 2>&1 || true
  rm -rf /var/spool/gridengine /var/lib/gridengine /run/gridengine
  echo PURGE | debconf-communicate gridengine-common >/dev/null 2>&1 || true
  if [ -e /etc/hosts.pre-geco-sge ]; then
    cat /etc/hosts.pre-geco-sge > /etc/hosts && rm -f /etc/hosts.pre-geco-sge
    log "   /etc/hosts restored"
  fi
fi
log "done"
