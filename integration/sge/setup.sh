#!/usr/bin/env bash
# setup.sh -- a real single-host Son of Grid Engine 8.1.9 (Debian 12 packages) with
# geco's hooks, for integration tests and the demo.
#
#   integration/sge/setup.sh            install (if needed), configure, start
#   integration/sge/setup.sh --print-packages   the Debian packages it installs, one a line
#   integration/sge/teardown.sh         stop the daemons again
#
# Run as root. Never through Debian's init scripts (their stop does not work: it looks
# for a pid file sge_qmaster never writes). Without systemd as PID 1 the daemons are
# started directly; with systemd they run as the units sgemaster.service and
# sgeexecd.service, written here (the names of Grid Engine's own templates, which
# geco's units and its execd drop-in name), and Debian's gridengine-master/-exec are
# masked. Idempotent, and fast when nothing changed: if both daemons run and the last
# successful run used the same settings, it only clears queue error states left behind
# and returns (~0.3 s).
#
# Settings (environment; unset or empty = default):
#   GECO_PROLOG        queue prolog, verbatim, e.g. 'root@/usr/libexec/geco/prolog $job_id $ja_task_id'
#   GECO_EPILOG        queue epilog, verbatim, e.g. 'root@/usr/libexec/geco/epilog $job_id $ja_task_id'
#   GECO_STARTER       queue starter_method, e.g. /usr/libexec/geco/starter
#   GECO_SHEPHERD_CMD  global shepherd_cmd; must end in 'exec /usr/lib/gridengine/sge_shepherd -bg'
#                      (all four default to NONE: plain Grid Engine)
#   SGE_SLOTS          slots of all.q on this host (default: nproc, one slot per core, so
#                      geco can bind whole cores to slots)
#   SGE_MEM            host capacity of h_vmem and m_mem_free (default: MemTotal, in M)
#   SGE_H_VMEM_DEFAULT implicit per-slot h_vmem of jobs that request none (default 2G; 0
#                      would make SGE kill every job that does not request h_vmem)
#   SGE_TRACE_LEVEL_MAX highest geco_trace_level a job may request (default 4 = debug)
#   GECO_EXECD_PRELOAD LD_PRELOAD for sge_execd (geco's exec() wrapper,
#                      /usr/lib/geco/libgeco_preload.so); empty = none. A running execd
#                      with another value is restarted (running jobs survive that).
#                      Under systemd the preload comes from sgeexecd.service's drop-in
#                      (scripts/install.sh puts geco's there) and this setting is ignored.
#   SGE_EXECD_PARAMS   execd_params of the global configuration (default none;
#                      KEEP_ACTIVE=true keeps active_jobs/* for debugging)
#   SGE_SCHEDULE_INTERVAL scheduler interval (default 0:0:1: jobs start within ~1 s)
#   SGE_TEST_USER      create this user (uid >= 1000, home dir) for submitting jobs
#   SGE_START_TIMEOUT  seconds to wait for each daemon (default 90)
#   SGE_GPUS           the host's count of the gpu consumable (default 2)
#   SGE_UNIT_FILES     yes: write sgemaster.service and sgeexecd.service also without
#                      systemd running (a VM image prepared in a chroot: its boots start them)
#
# What it configures: admin/submit/exec host = this host; complexes h_vmem (consumable,
# default SGE_H_VMEM_DEFAULT), m_mem_free (consumable per slot), geco_trace_level (INT,
# requestable, not consumable), gpu (consumable INT per slot); host group @allhosts; PEs smp ($pe_slots) and mpi
# ($round_robin); queue all.q with the hooks above; scheduler reacting within ~1 s;
# accounting written at once (qacct -j right after a job ends).
set -euo pipefail

export PATH=/usr/sbin:/usr/bin:/sbin:/bin
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"  # SGE_ROOT, SGE_CELL, the clients first
export DEBIAN_FRONTEND=noninteractive
umask 022

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
SPOOL=/var/spool/gridengine
COMMON=$SGE_ROOT/$SGE_CELL/common
STATE=$SPOOL/geco-setup.state
QUEUE=all.q
TIMEOUT=${SGE_START_TIMEOUT:-90}
PACKAGES=(gridengine-master gridengine-exec gridengine-client gridengine-common netbase)
if [ "${1:-}" = --print-packages ]; then printf '%s\n' "${PACKAGES[@]}"; exit 0; fi
SYSTEMD=no
[ -d /run/systemd/system ] && SYSTEMD=yes

T0=$(date +%s%N)
log() { local ms=$(( ($(date +%s%N) - T0) / 1000000 )); printf '[sge-setup %3d.%01ds] %s\n' $((ms / 1000)) $(((ms % 1000) / 100)) "$*"; }
die() { echo "[sge-setup] ERROR: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root"

# Two test sessions starting at once must not configure the cluster concurrently.
mkdir -p /run/lock
exec 9>/run/lock/geco-sge-setup.lock
flock 9

TMPD=$(mktemp -d /tmp/geco-sge-setup.XXXXXX)
cleanup() {
  [ -n "${POLICY_RC_ADDED:-}" ] && rm -f /usr/sbin/policy-rc.d
  rm -rf "$TMPD"
}
trap cleanup EXIT

# ---------------------------------------------------------------------------
# settings
# ---------------------------------------------------------------------------
or_none() { if [ -n "${1:-}" ]; then printf '%s' "$1"; else printf 'NONE'; fi; }
PROLOG=$(or_none "${GECO_PROLOG:-}")
EPILOG=$(or_none "${GECO_EPILOG:-}")
STARTER=$(or_none "${GECO_STARTER:-}")
SHEPHERD=$(or_none "${GECO_SHEPHERD_CMD:-}")
SLOTS=${SGE_SLOTS:-$(nproc)}
MEM=${SGE_MEM:-$(awk '/^MemTotal:/ {printf "%dM", $2 / 1024}' /proc/meminfo)}
HVMEM_DEFAULT=${SGE_H_VMEM_DEFAULT:-2G}
TRACE_MAX=${SGE_TRACE_LEVEL_MAX:-4}
GPUS=${SGE_GPUS:-2}
EXECD_PARAMS=${SGE_EXECD_PARAMS:-none}
EXECD_PRELOAD=${GECO_EXECD_PRELOAD:-}
SCHEDULE_INTERVAL=${SGE_SCHEDULE_INTERVAL:-0:0:1}
HN=$(hostname)

# ---------------------------------------------------------------------------
# daemon helpers
# ---------------------------------------------------------------------------
have_sge() { [ -x /usr/lib/gridengine/qconf ] && [ -e "$COMMON/act_qmaster" ]; }
# the name SGE itself uses for this host (after resolution and host_aliases)
sge_host() { /usr/lib/gridengine/gethostname -aname 2>/dev/null || echo "$HN"; }
pid_alive() { # pidfile comm
  local p; p=$(cat "$1" 2>/dev/null || true)
  [ -n "$p" ] && [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$2" ]
}
qmaster_up() { pid_alive "$SPOOL/qmaster/qmaster.pid" sge_qmaster && qconf -sh >/dev/null 2>&1; }
execd_up() { pid_alive "$SPOOL/execd/$SGEH/execd.pid" sge_execd; }
execd_pid() { cat "$SPOOL/execd/$SGEH/execd.pid" 2>/dev/null; }
queue_states() { # prints the state letters of QUEUE@SGEH ("" = fine); fails if not listed
  qstat -f -q "$QUEUE@$SGEH" 2>/dev/null | awk -v q="$QUEUE@$SGEH" \
    '$1 == q { found = 1; st = (NF >= 6) ? $6 : "" } END { if (!found) exit 1; print st }'
}
# reporting = listed and execd heard from (no u); usable = also not disabled (d).
# An error state E does not count: fix_queue clears it.
queue_reporting() { local st; st=$(queue_states) && [[ "$st" != *u* ]]; }
queue_usable() { local st; st=$(queue_states) && [[ "$st" != *u* && "$st" != *d* ]]; }
fix_queue() {
  local st; st=$(queue_states) || return 0
  if [[ "$st" == *E* ]]; then
    # a hook that failed in an earlier run leaves the queue in error state for good
    qmod -c "$QUEUE@$SGEH" >/dev/null
    log "   cleared error state (E) of $QUEUE@$SGEH left by an earlier run"
  fi
  if [[ "$st" == *d* ]]; then
    qmod -e "$QUEUE@$SGEH" >/dev/null
    log "   enabled $QUEUE@$SGEH (was disabled)"
  fi
}
# execd's environment is inherited by every shepherd, prolog, job and epilog: start
# the daemons with nothing of ours (env -i), in their own session (setsid), from /.
# start_daemon CMD [VAR=value...]: the extra variables (only LD_PRELOAD for execd) are the
# one thing of ours a daemon gets.
start_daemon() {
  if [ "$SYSTEMD" = yes ]; then
    local unit; unit=$(unit_of "$1")
    systemctl start "$unit" 2>/dev/null \
      || die "systemctl start $unit failed:$(printf '\n'; journalctl -u "$unit" -n 15 --no-pager -o cat)"
  else
    (cd / && env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "${@:2}" setsid "$1" \
       </dev/null >/dev/null 2>&1)
  fi
}
unit_of() { case "$1" in */sge_qmaster) echo sgemaster.service ;; *) echo sgeexecd.service ;; esac; }
# The daemons as systemd units (only with systemd as PID 1). KillMode=process for
# execd: stopping or restarting it leaves the running jobs' shepherds alone, as Grid
# Engine expects of an execd restart. write_unit_files says whether one changed.
write_unit_files() {
  local changed=no
  printf '%s\n' "# written by geco's integration/sge/setup.sh" "[Unit]" \
    "Description=Grid Engine qmaster" "After=network-online.target remote-fs.target" "" \
    "[Service]" "Type=forking" "PIDFile=$SPOOL/qmaster/qmaster.pid" \
    "ExecStart=/usr/sbin/sge_qmaster" "Environment=LANG=C.UTF-8" "TimeoutStopSec=90" \
    > "$TMPD/sgemaster.service"
  printf '%s\n' "# written by geco's integration/sge/setup.sh" "[Unit]" \
    "Description=Grid Engine execution daemon" \
    "After=network-online.target remote-fs.target sgemaster.service" "" \
    "[Service]" "Type=forking" "PIDFile=$SPOOL/execd/$SGEH/execd.pid" \
    "ExecStart=/usr/sbin/sge_execd" "Environment=LANG=C.UTF-8" "KillMode=process" \
    > "$TMPD/sgeexecd.service"
  for unit in sgemaster.service sgeexecd.service; do
    cmp -s "$TMPD/$unit" "/etc/systemd/system/$unit" && continue
    install -m 0644 "$TMPD/$unit" /etc/systemd/system/
    changed=yes
  done
  [ "$changed" = yes ]
}
write_units() {
  local changed=no
  write_unit_files && changed=yes
  for unit in gridengine-master.service gridengine-exec.service; do
    [ -e "/etc/init.d/${unit%.service}" ] || continue
    if [ -n "$(unit_pids "$unit")" ]; then
      # started at boot or by the package: it holds the daemon's port. Its stop cannot
      # find the daemon, systemd can: end what runs in the unit's cgroup.
      systemctl kill --signal=SIGTERM "$unit"
      wait_for 60 "$unit to end" unit_empty "$unit"
      systemctl stop "$unit"
      log "   stopped what Debian's $unit had started"
    fi
    if [ "$(systemctl is-enabled "$unit" 2>/dev/null)" != masked ]; then
      systemctl mask --quiet "$unit"
      changed=yes
      log "   masked Debian's $unit (its stop cannot stop the daemon)"
    fi
  done
  if [ "$changed" = yes ]; then
    systemctl daemon-reload
    log "   wrote sgemaster.service and sgeexecd.service"
  fi
}
# The pids in a unit's cgroup (cgroup v2, or the unified hierarchy of a hybrid layout).
unit_pids() {
  local cg; cg=$(systemctl show -p ControlGroup --value "$1")
  [ -n "$cg" ] || return 0
  cat "/sys/fs/cgroup$cg/cgroup.procs" "/sys/fs/cgroup/unified$cg/cgroup.procs" 2>/dev/null || true
}
unit_empty() { [ -z "$(unit_pids "$1")" ]; }
# The LD_PRELOAD sgeexecd.service gives execd (its drop-ins included).
unit_preload() {
  systemctl show -p Environment --value sgeexecd.service | tr ' ' '\n' | sed -n 's/^LD_PRELOAD=//p'
}
wait_for() { # seconds description command...
  local t=$1 what=$2; shift 2
  local end=$(( $(date +%s) + t ))
  until "$@"; do
    [ "$(date +%s)" -lt "$end" ] || die "timeout after ${t}s waiting for $what"
    sleep 0.2
  done
}
ensure_user() {
  [ -n "${SGE_TEST_USER:-}" ] || return 0
  if ! id "$SGE_TEST_USER" >/dev/null 2>&1; then
    useradd -m -K UID_MIN=1000 -K GID_MIN=1000 -s /bin/bash "$SGE_TEST_USER"
    log "   created user $SGE_TEST_USER ($(id "$SGE_TEST_USER"))"
  fi
  # SGE's min_uid/min_gid are 1000: it refuses jobs of system accounts
  [ "$(id -u "$SGE_TEST_USER")" -ge 1000 ] || die "user $SGE_TEST_USER has uid < 1000: Grid Engine will not run its jobs"
}
fingerprint() {
  # every input of the configuration; the script itself stands for what it does with them
  printf '%s\n' "host=$SGEH" "slots=$SLOTS" "mem=$MEM" "h_vmem_default=$HVMEM_DEFAULT" \
    "trace_max=$TRACE_MAX" "prolog=$PROLOG" "epilog=$EPILOG" "starter=$STARTER" \
    "shepherd=$SHEPHERD" "execd_params=$EXECD_PARAMS" "schedule_interval=$SCHEDULE_INTERVAL" \
    "execd_preload=$EXECD_PRELOAD" \
    "script=$(sha256sum < "$HERE/setup.sh" | cut -d' ' -f1)"
}
# the fingerprint but execd's LD_PRELOAD: equal, only execd needs a restart
same_but_preload() { cmp -s <(fingerprint | grep -v '^execd_preload=') <(grep -v '^execd_preload=' "$STATE"); }
# LD_PRELOAD of the running execd, to restart it when GECO_EXECD_PRELOAD changed
execd_preload() { tr '\0' '\n' < "/proc/$(execd_pid)/environ" 2>/dev/null | sed -n 's/^LD_PRELOAD=//p'; }
# execd_as_configured GLOBAL_CHANGED: execd running with GECO_EXECD_PRELOAD and the global
# configuration; restarted when either changed (running jobs survive an execd restart)
execd_as_configured() {
  if execd_up && { [ "$1" = yes ] || [ "$(execd_preload)" != "$EXECD_PRELOAD" ]; }; then
    local old; old=$(execd_pid)
    qconf -ke "$SGEH" >/dev/null 2>&1 || true
    gone() { [ "$(cat "/proc/$old/comm" 2>/dev/null)" != sge_execd ]; }
    wait_for 30 "sge_execd (pid $old) to stop" gone
    log "   stopped execd (pid $old) to apply the global configuration or its LD_PRELOAD"
  fi
  if execd_up; then
    log "   running (pid $(execd_pid))"
  else
    start_daemon /usr/sbin/sge_execd ${EXECD_PRELOAD:+"LD_PRELOAD=$EXECD_PRELOAD"}
    wait_for "$TIMEOUT" "sge_execd to report ($QUEUE@$SGEH without state u)" queue_reporting
    log "   started (pid $(execd_pid))"
  fi
  fix_queue
  queue_usable || die "$QUEUE@$SGEH not usable: states '$(queue_states)'"
}
# sge_qmaster answering qconf, started if none runs. One that runs but does not answer
# yet (starting, busy, or timing out on host names that no longer resolve) is waited for:
# a second one would fight the first for its endpoint and cut every execd off ("endpoint
# is not unique")
qmaster_answering() {
  if pid_alive "$SPOOL/qmaster/qmaster.pid" sge_qmaster && ! qmaster_up; then
    log "   running (pid $(cat "$SPOOL/qmaster/qmaster.pid")) but silent: waiting for it"
    wait_for "$TIMEOUT" "the running sge_qmaster to answer qconf" qmaster_up
  fi
  if qmaster_up; then
    log "   running (pid $(cat "$SPOOL/qmaster/qmaster.pid"))"
  else
    start_daemon /usr/sbin/sge_qmaster
    wait_for "$TIMEOUT" "sge_qmaster to answer qconf" qmaster_up
    log "   started (pid $(cat "$SPOOL/qmaster/qmaster.pid"))"
  fi
}
ready() {
  fingerprint > "$STATE"
  log "ready: host $SGEH, qmaster pid $(cat "$SPOOL/qmaster/qmaster.pid"), execd pid $(execd_pid)"
}

# ---------------------------------------------------------------------------
# 0. a qmaster that teardown.sh --no-wait told to stop is let finish first: it would
#    otherwise answer qconf for a few seconds and then vanish under our feet
# ---------------------------------------------------------------------------
STOPPING=$SPOOL/qmaster/geco-stopping
if [ -e "$STOPPING" ]; then
  p=$(cat "$STOPPING" 2>/dev/null || true)
  if [ -n "$p" ] && [ "$(cat "/proc/$p/comm" 2>/dev/null)" = sge_qmaster ]; then
    log "waiting for sge_qmaster (pid $p) to finish shutting down"
    qm_gone() { [ "$(cat "/proc/$p/comm" 2>/dev/null)" != sge_qmaster ]; }
    wait_for 60 "sge_qmaster (pid $p) to exit" qm_gone
  fi
  rm -f "$STOPPING"
fi

# ---------------------------------------------------------------------------
# 1. fast path: already up with the same settings
# ---------------------------------------------------------------------------
[ "$SYSTEMD" = yes ] && EXECD_PRELOAD=$(unit_preload)
if have_sge; then
  SGEH=$(sge_host)
  if [ -e "$STATE" ] && fingerprint | cmp -s - "$STATE" && qmaster_up && execd_up && queue_usable; then
    log "already running with these settings (host $SGEH, prolog=$PROLOG)"
    fix_queue
    ensure_user
    exit 0
  fi
  # only execd's LD_PRELOAD asked to change (the tests do this between test modules)
  if [ -e "$STATE" ] && same_but_preload && qmaster_up && execd_up; then
    log "== sge_execd: LD_PRELOAD=${EXECD_PRELOAD:-none}, all else as running"
    execd_as_configured no
    ready
    exit 0
  fi
  # a prepared node (the VM tests' image, where this script ran at the build) or one
  # rebooted: configured with these settings, execd down (the qmaster may be starting:
  # a VM boot starts it while geco's package installs). The spool holds the
  # configuration; only the daemons are started (each qconf check of steps 2-6 is a ~3 s
  # round trip on an emulated machine, ~90 s in all beside the suite)
  if [ -e "$STATE" ] && same_but_preload && ! execd_up; then
    log "== configured with these settings (host $SGEH): starting the daemons"
    if [ "$SYSTEMD" = yes ]; then write_units; EXECD_PRELOAD=$(unit_preload); fi
    qmaster_answering
    execd_as_configured no
    ensure_user
    ready
    exit 0
  fi
fi
rm -f "$STATE"

# ---------------------------------------------------------------------------
# 2. host name resolution
# ---------------------------------------------------------------------------
# SGE refuses a connection whose source address does not resolve back to the host
# name the client claims. With the name on a loopback line (Debian's 127.0.1.1, a
# sandbox's "127.0.0.1 vm") every client fails with "access denied (client IP
# resolved to host name "localhost" ...)". So the name must resolve to a real address.
log "== host name"
resolved=$(getent ahostsv4 "$HN" 2>/dev/null | awk 'NR == 1 {print $1}') || true
USE_ALIASES=no
case "$resolved" in
  '' | 127.*)
    ip4=$(hostname -I 2>/dev/null | tr ' ' '\n' | grep -E '^[0-9]+(\.[0-9]+){3}$' | grep -v '^127\.' | head -n 1 || true)
    if [ -n "$ip4" ]; then
      [ -e /etc/hosts.pre-geco-sge ] || cp -p /etc/hosts /etc/hosts.pre-geco-sge
      short=${HN%%.*}
      # drop the name from loopback lines (and our older line), then append "IP name"
      awk -v h="$HN" -v s="$short" '
        /# added by geco integration\/sge\/setup.sh$/ { next }
        { line = $0; sub(/#.*/, "", line); n = split(line, f, /[ \t]+/); i0 = (f[1] == "") ? 2 : 1
          if (n > i0 && f[i0] ~ /^127\./) {
            keep = f[i0]; hit = 0; cnt = 0
            for (i = i0 + 1; i <= n; i++) { if (f[i] == "") continue
              if (f[i] == h || f[i] == s) hit = 1; else { keep = keep "\t" f[i]; cnt++ } }
            if (hit) { if (cnt > 0) print keep; next }
          }
          print }' /etc/hosts > "$TMPD/hosts"
      names=$HN; [ "$short" != "$HN" ] && names="$HN $short"
      printf '%s\t%s\t# added by geco integration/sge/setup.sh\n' "$ip4" "$names" >> "$TMPD/hosts"
      # rewritten in place, not replaced: /etc/hosts is often a bind mount in containers
      cat "$TMPD/hosts" > /etc/hosts
      log "   /etc/hosts: $HN -> $ip4 (original kept in /etc/hosts.pre-geco-sge)"
    else
      # Works too, but SGE then calls this host "localhost" (spool dir, SGE_O_HOST).
      USE_ALIASES=yes
      log "   no non-loopback IPv4 address: SGE host_aliases '$HN localhost'"
    fi ;;
esac
log "   $HN resolves to $(getent ahostsv4 "$HN" | awk 'NR == 1 {print $1}')"

# ---------------------------------------------------------------------------
# 3. packages (debconf preseeded: no questions)
# ---------------------------------------------------------------------------
log "== packages"
# missing_packages, install_packages (no daemon started by a postinst: we start them ourselves)
. "$HERE/../../scripts/packages.sh"
mapfile -t missing < <(missing_packages "${PACKAGES[@]}")
if [ ${#missing[@]} -gt 0 ]; then
  debconf-set-selections <<EOF
gridengine-common shared/gridengineconfig boolean true
gridengine-common shared/gridenginecell string $SGE_CELL
gridengine-common shared/gridenginemaster string $HN
EOF
  install_packages "$TMPD/apt.log" "${missing[@]}"
  log "   installed ${missing[*]}"
fi
log "   gridengine $(dpkg-query -W -f='${Version}' gridengine-master)"
# netbase's /etc/services names the ports; without it every daemon and client needs
# SGE_QMASTER_PORT/SGE_EXECD_PORT
grep -q '^sge-qmaster' /etc/services || die "/etc/services lacks sge-qmaster (netbase missing?)"

# ---------------------------------------------------------------------------
# 4. cell and spool (re-created if someone wiped the spool)
# ---------------------------------------------------------------------------
log "== cell and spool"
for d in "$SGE_ROOT" "$SGE_ROOT/$SGE_CELL" "$COMMON" "$SPOOL/qmaster" "$SPOOL/qmaster/job_scripts" \
         "$SPOOL/spooldb" "$SPOOL/execd"; do
  mkdir -p "$d"; chown sgeadmin:sgeadmin "$d"
done
[ -e "$COMMON/bootstrap" ] || install -m 0644 -o sgeadmin -g sgeadmin /usr/share/gridengine/default-bootstrap "$COMMON/bootstrap"
if [ ! -e "$SPOOL/spooldb/sge" ]; then
  su -s /bin/sh -c "/usr/share/gridengine/scripts/init_cluster $SGE_ROOT $SGE_CELL $SPOOL/spooldb sgeadmin" sgeadmin >/dev/null
  log "   initialised the spool database"
fi
if [ "$USE_ALIASES" = yes ]; then
  echo "$HN localhost" > "$COMMON/host_aliases"; chown sgeadmin:sgeadmin "$COMMON/host_aliases"
elif [ -e "$COMMON/host_aliases" ] && grep -q ' localhost$' "$COMMON/host_aliases"; then
  rm -f "$COMMON/host_aliases"
fi
SGEH=$(sge_host)
[ -n "$SGEH" ] || SGEH=$HN
# a new container has a new host name: the master is always this host
echo "$SGEH" > "$COMMON/act_qmaster"; chown sgeadmin:sgeadmin "$COMMON/act_qmaster"
log "   SGE host name: $SGEH"
if [ "$SYSTEMD" = yes ]; then
  write_units
  EXECD_PRELOAD=$(unit_preload)
elif [ "${SGE_UNIT_FILES:-}" = yes ]; then
  write_unit_files || true
fi

# ---------------------------------------------------------------------------
# 5. qmaster
# ---------------------------------------------------------------------------
log "== sge_qmaster"
qmaster_answering

# ---------------------------------------------------------------------------
# 6. configuration: every object from a file (qconf -A*/-M*), only written when it differs
# ---------------------------------------------------------------------------
log "== configuration"
q() { "$@" >"$TMPD/q.out" 2>&1 || { cat "$TMPD/q.out" >&2; die "failed: $*"; }; }
# "\"-continued lines joined, so every key is on one line
join_cont() { awk '{ if (sub(/\\$/, "")) { buf = buf $0; next } print buf $0; buf = "" }'; }
# same content, whatever the spacing (qconf pads columns; our rewritten lines do not)
same() { cmp -s <(awk '{ $1 = $1; print }' "$1") <(awk '{ $1 = $1; print }' "$2"); }
# every line of the file is in what qconf shows (which adds what the qmaster keeps itself,
# e.g. an exec host's load_values and processors), whatever the spacing
has_all() { # shown file
  awk 'NR == FNR { $1 = $1; want[$0] = 1; next } { $1 = $1; delete want[$0] }
       END { for (line in want) exit 1 }' "$2" "$1"
}
# each qconf costs ~3 s on an emulated machine (the VM tests'): written only when it differs
add_or_modify() { # show-option add-option modify-option name file
  if qconf "$1" "$4" 2>/dev/null | join_cont > "$TMPD/shown"; then
    has_all "$TMPD/shown" "$5" || { q qconf "$3" "$5"; log "   $4 rewritten"; }
  else
    q qconf "$2" "$5"; log "   $4 added"
  fi
}

qconf -sh 2>/dev/null | grep -qx "$SGEH" || q qconf -ah "$SGEH"
qconf -ss 2>/dev/null | grep -qx "$SGEH" || q qconf -as "$SGEH"

# complexes:
#   h_vmem           consumable with a default: SGE kills jobs that request none otherwise
#   m_mem_free       consumable per slot; SoGE has no such built-in, geco reads it
#   geco_trace_level requestable INT, not consumable: a job's per-job trace log level
#   gpu              consumable INT per slot, as Son of Grid Engine sites count GPUs (geco
#                    picks the ids); the host books GPUS of them (a GPU test's fake devices)
qconf -sc > "$TMPD/complex.orig"
awk -v d="$HVMEM_DEFAULT" '
  function row(n, s, t, r, rq, c, df) { printf "%-19s %-10s %-9s %-5s %-11s %-10s %-8s %s\n", n, s, t, r, rq, c, df, "0" }
  $1 == "m_mem_free" || $1 == "geco_trace_level" || $1 == "gpu" { next }
  $1 == "h_vmem" { row("h_vmem", "h_vmem", "MEMORY", "<=", "YES", "YES", d); next }
  { print }
  END { row("m_mem_free", "mmf", "MEMORY", "<=", "YES", "YES", "0")
        row("geco_trace_level", "gtl", "INT", "<=", "YES", "NO", "0")
        row("gpu", "gpu", "INT", "<=", "YES", "YES", "0") }' "$TMPD/complex.orig" > "$TMPD/complex"
same "$TMPD/complex.orig" "$TMPD/complex" || q qconf -Mc "$TMPD/complex"

# global configuration (the file *name* must be "global"):
#   shepherd_cmd, execd_params as set; accounting written at once instead of every
#   15 s, so that qacct knows a job as soon as qstat has forgotten it; load reports every
#   5 s instead of 40: an execd finds a restarted qmaster at its next report, so a job
#   re-queued while the qmaster was down runs again ~5 s after it is back, not ~40-70 s
GLOBAL_CHANGED=no
qconf -sconf global | grep -v '^#' | join_cont > "$TMPD/global.orig"
awk -v sh="$SHEPHERD" -v ep="$EXECD_PARAMS" '
  $1 == "shepherd_cmd" { printf "%-28s %s\n", $1, sh; next }
  $1 == "execd_params" { printf "%-28s %s\n", $1, ep; next }
  $1 == "load_report_time" { printf "%-28s %s\n", $1, "00:00:05"; next }
  $1 == "reporting_params" {
    out = ""; seen = 0
    for (i = 2; i <= NF; i++) {
      if ($i ~ /^accounting_flush_time=/) { $i = "accounting_flush_time=00:00:00"; seen = 1 }
      out = out " " $i
    }
    if (!seen) out = out " accounting_flush_time=00:00:00"
    printf "%-28s%s\n", $1, out; next }
  { print }' "$TMPD/global.orig" > "$TMPD/global"
if ! same "$TMPD/global.orig" "$TMPD/global"; then
  q qconf -Mconf "$TMPD/global"
  GLOBAL_CHANGED=yes
fi

# scheduler: react within ~1 s (the default interval is 15 s)
qconf -ssconf | join_cont > "$TMPD/sconf.orig"
awk -v si="$SCHEDULE_INTERVAL" '
  $1 == "schedule_interval" { printf "%-33s %s\n", $1, si; next }
  $1 == "flush_submit_sec" || $1 == "flush_finish_sec" { printf "%-33s %s\n", $1, "1"; next }
  { print }' "$TMPD/sconf.orig" > "$TMPD/sconf"
same "$TMPD/sconf.orig" "$TMPD/sconf" || q qconf -Msconf "$TMPD/sconf"

printf 'group_name @allhosts\nhostlist %s\n' "$SGEH" > "$TMPD/allhosts"
add_or_modify -shgrp -Ahgrp -Mhgrp @allhosts "$TMPD/allhosts"

write_pe() { # name allocation_rule
  cat > "$TMPD/pe_$1" <<EOF
pe_name            $1
slots              9999
user_lists         NONE
xuser_lists        NONE
start_proc_args    NONE
stop_proc_args     NONE
allocation_rule    $2
control_slaves     TRUE
job_is_first_task  TRUE
urgency_slots      min
accounting_summary TRUE
qsort_args         NONE
EOF
  add_or_modify -sp -Ap -Mp "$1" "$TMPD/pe_$1"
}
write_pe smp '$pe_slots'
write_pe mpi '$round_robin'

write_exechost() { # name complex_values
  cat > "$TMPD/exechost_$1" <<EOF
hostname              $1
load_scaling          NONE
complex_values        $2
user_lists            NONE
xuser_lists           NONE
projects              NONE
xprojects             NONE
usage_scaling         NONE
report_variables      NONE
EOF
  add_or_modify -se -Ae -Me "$1" "$TMPD/exechost_$1"
}
# cluster-wide: the trace levels any job may ask for; per host: its memory
write_exechost global "geco_trace_level=$TRACE_MAX"
write_exechost "$SGEH" "h_vmem=$MEM,m_mem_free=$MEM,gpu=$GPUS"

cat > "$TMPD/queue" <<EOF
qname                 $QUEUE
hostlist              @allhosts
seq_no                0
load_thresholds       NONE
suspend_thresholds    NONE
nsuspend              1
suspend_interval      00:05:00
priority              0
min_cpu_interval      00:05:00
processors            UNDEFINED
qtype                 BATCH INTERACTIVE
ckpt_list             NONE
pe_list               smp mpi
rerun                 FALSE
slots                 $SLOTS
tmpdir                /tmp
shell                 /bin/sh
prolog                $PROLOG
epilog                $EPILOG
shell_start_mode      posix_compliant
starter_method        $STARTER
suspend_method        NONE
resume_method         NONE
terminate_method      NONE
notify                00:00:60
owner_list            NONE
user_lists            NONE
xuser_lists           NONE
subordinate_list      NONE
complex_values        NONE
projects              NONE
xprojects             NONE
calendar              NONE
initial_state         default
s_rt                  INFINITY
h_rt                  INFINITY
s_cpu                 INFINITY
h_cpu                 INFINITY
s_fsize               INFINITY
h_fsize               INFINITY
s_data                INFINITY
h_data                INFINITY
s_stack               INFINITY
h_stack               INFINITY
s_core                INFINITY
h_core                INFINITY
s_rss                 INFINITY
h_rss                 INFINITY
s_vmem                INFINITY
h_vmem                INFINITY
EOF
# load_thresholds NONE: a busy CI box must not put the queue into alarm state
add_or_modify -sq -Aq -Mq "$QUEUE" "$TMPD/queue"
log "   $QUEUE: slots=$SLOTS, h_vmem/m_mem_free capacity=$MEM, h_vmem default=$HVMEM_DEFAULT, geco_trace_level<=$TRACE_MAX"
log "   prolog=$PROLOG"
log "   epilog=$EPILOG"
log "   starter_method=$STARTER shepherd_cmd=$SHEPHERD"

# ---------------------------------------------------------------------------
# 7. execd: started after the configuration; restarted when the global configuration
#    changed, because a running execd picks up shepherd_cmd/execd_params only lazily
#    (observed: jobs 30-60 s later still used the old shepherd_cmd). Running jobs
#    survive an execd restart.
# ---------------------------------------------------------------------------
log "== sge_execd"
execd_as_configured "$GLOBAL_CHANGED"

# ---------------------------------------------------------------------------
# 8. test user
# ---------------------------------------------------------------------------
ensure_user
ready
