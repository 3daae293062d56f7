#!/usr/bin/env bash
# cluster.sh -- a Grid Engine cluster on one machine: the qmaster of integration/sge and
# N execution hosts, each in its own network and UTS namespace, with its own execd,
# gecod, state dir, geco config and cgroup parent holding its share of the cores.
#
#   integration/cluster/cluster.sh up [N]    bring up N hosts (default 3): geco-node1..N
#   integration/cluster/cluster.sh status    qhost and each host's daemons
#   integration/cluster/cluster.sh down      stop and remove everything `up` made
#   integration/cluster/cluster.sh stop-gecod K | start-gecod K   host K's gecod only
#   integration/cluster/cluster.sh run K command...   a command on host K (its namespaces,
#                                            its /etc/geco), e.g. run 1 geco status --job 42
#
# Run as root, after scripts/install.sh (geco); `up` runs integration/sge/setup.sh when no
# qmaster answers. What each host k gets:
#   network    namespace geco-test-n<k>, veth gecotv<k> <-> eth0, 10.77.<k>.11/24 (the
#              machine's side 10.77.<k>.1, the default route; forwarding on, so hosts
#              reach each other and the qmaster), names in /etc/netns/<ns>/hosts, and
#              geco-node<k> in the machine's /etc/hosts for the qmaster (that line
#              outlives `down`: see there)
#   hostname   geco-node<k> (a UTS namespace per daemon, all named so)
#   mounts     a mount namespace of its own (kept on /run/geco-test-cluster/mnt/node<k>),
#              all its daemons in it: its /etc/geco and /etc/hosts bound there, and the
#              pins of its jobs' private /tmp ([tmp] node_namespace = "": gecod's)
#   execd      Grid Engine's, spool /var/spool/gridengine/execd/geco-node<k>, with geco's
#              exec() preload, additional group ids of its own (gid_range 30<k>00-30<k>99)
#   geco       /etc/netns/<ns>/geco/ (mounted on /etc/geco for its daemons): geco.toml with
#              state dir /var/lib/geco-test-node<k>, cgroup parent geco-test-node<k>,
#              sockets /run/geco-test-node<k>/, strays off (every host sees every
#              process: /proc is the machine's); the site's quarantine key, and one
#              cluster key for all hosts (/run/geco-test-cluster/cluster.key, made by `up`);
#              two GPUs, device nodes c 195:0 and 195:1 in /run/geco-test-cluster/dev
#   qstat      a counting wrapper: each call appends "<host> <args>" to
#              /run/geco-test-cluster/qstat.log, then runs Grid Engine's qstat (and
#              Grid Engine's qconf beside it)
#   gecod      geco daemon in the namespace, pid in /run/geco-test-node<k>/gecod.pid
#   cores      cpuset geco-test-node<k> made beforehand with core (k-1) mod ncores: on a
#              machine with fewer cores than hosts, hosts share a core (to geco they are
#              separate machines)
# and the queue geco-test-cluster.q (1 slot and 1 gpu per host, geco's prolog, epilog and
# starter, each host's tmpdir /tmp/geco-test-node<k>: jobs see separate /tmp dirs), which
# runs only jobs that request -l geco_test_cluster=TRUE (a FORCED complex: never a job
# that names no queue, the demo's or another test's)
# with the PE geco-test-cluster ($round_robin: a job of N slots gets one on each host).
# `down` undoes all of it, also after an interrupted `up`; it ends only the processes
# `up` started (by their pid files).
set -euo pipefail

SYSTEM_PATH=/usr/sbin:/usr/bin:/sbin:/bin  # the daemons' (execd's is every job's)
export PATH=$SYSTEM_PATH
. "$(dirname "${BASH_SOURCE[0]}")/../sge/env.sh"  # SGE_ROOT, SGE_CELL, the clients first
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
REPO=$(cd "$HERE/../.." && pwd -P)
SPOOL=/var/spool/gridengine/execd
PRELOAD=/usr/lib/geco/libgeco_preload.so
GECO=/usr/bin/geco
QUEUE=geco-test-cluster.q
PE=geco-test-cluster
COMPLEX=geco_test_cluster  # FORCED: the queue runs only jobs that request it
STATE=/run/geco-test-cluster  # nodes up, one file each: what `down` undoes
MARK="# geco-test-cluster"
HOOKS_PROLOG='root@/usr/libexec/geco/prolog $job_id $ja_task_id'
HOOKS_EPILOG='root@/usr/libexec/geco/epilog $job_id $ja_task_id'
HOOKS_STARTER=/usr/libexec/geco/starter

log() { printf '[cluster] %s\n' "$*"; }
die() { echo "[cluster] ERROR: $*" >&2; exit 1; }
ns() { echo "geco-test-n$1"; }
host() { echo "geco-node$1"; }
ip_of() { echo "10.77.$1.11"; }
run_dir() { echo "/run/geco-test-node$1"; }
nodes_up() { [ -d "$STATE" ] && ls "$STATE" 2>/dev/null | sed -n 's/^node//p' | sort -n; }
pid_alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
mnt_of() { echo "$STATE/mnt/node$1"; }
in_node() { # k command... : run in host k's network namespace and its mount namespace
  # (its /etc/geco and /etc/hosts; one for all its daemons, as a host has: a job's private
  # /tmp that its gecod pins there is where its execd's shepherds enter it), with its
  # hostname (a UTS namespace of the command's own; not `ip netns exec`, which mounts a
  # sysfs of the namespace over /sys and so hides the cgroups); EXEC=exec: in place of
  # the calling shell
  local k=$1; shift
  ${EXEC:-} nsenter --net="/run/netns/$(ns "$k")" --mount="$(mnt_of "$k")" unshare --uts \
    sh -c 'hostname "$0" && exec "$@"' "$(host "$k")" "$@"
}
node_mounts() { # k: host k's mount namespace, kept on a file (its daemons enter it)
  local k=$1 etc; etc=/etc/netns/$(ns "$k")
  # the namespace files need a private mount to live on
  install -d -m 0700 "$STATE/mnt"
  mountpoint -q "$STATE/mnt" || mount --bind "$STATE/mnt" "$STATE/mnt"
  mount --make-private "$STATE/mnt"
  touch "$(mnt_of "$k")" "$etc/hosts"
  unshare --mount="$(mnt_of "$k")" --propagation private \
    sh -c 'mount --bind "$0/geco" /etc/geco && mount --bind "$0/hosts" /etc/hosts' "$etc"
}
close_fds() { # in a subshell about to start a daemon: no descriptor of ours beyond stdio
  # (a lock the caller holds, e.g. flock(1) around `up`, would be held for the daemon's life)
  local fd
  for fd in $(ls /proc/$BASHPID/fd); do [ "$fd" -gt 2 ] && eval "exec $fd>&-"; done
  return 0
}
qmaster_addr() { getent ahostsv4 "$(hostname)" | awk 'NR == 1 { print $1 }'; }

node_config() { # k: the host's geco.toml
  local k=$1 run; run=$(run_dir "$k")
  cat <<EOF
# geco on emulated host $(host "$k") (integration/cluster/cluster.sh)
[paths]
state_dir = "/var/lib/geco-test-node$k"
execd_spool_dir = "$SPOOL"

[qstat]
command = "$STATE/qstat"

[cgroup]
name = "geco-test-node$k"

[gpu]
devices = ["$STATE/dev/gpu0", "$STATE/dev/gpu1"]

[log]
trace_dir = "/var/log/geco-test-node$k/trace"

[strays]
kill = false

[tmp]
# jobs' namespaces are made from this host's (gecod's, shared with its execd), not
# from PID 1's: the machine's
node_namespace = ""

[gecod]
socket = "path:$run/gecod.sock"
privileged_socket = "path:$run/gecod-root.sock"
reaper_interval = 10.0
EOF
}

cpuset_dir() { echo "/sys/fs/cgroup/cpuset/geco-test-node$1"; }
tmp_dir() { echo "/tmp/geco-test-node$1"; }

net_node() { # k: its network, names, directories and geco config
  local k=$1 n h addr run etc
  n=$(ns "$k"); h=$(host "$k"); addr=$(ip_of "$k"); run=$(run_dir "$k"); etc=/etc/netns/$n
  touch "$STATE/node$k"
  ip netns add "$n"
  ip link add "gecotv$k" type veth peer name eth0 netns "$n"
  ip addr add "10.77.$k.1/24" dev "gecotv$k"
  ip link set "gecotv$k" up
  ip -n "$n" link set lo up
  ip -n "$n" addr add "$addr/24" dev eth0
  ip -n "$n" link set eth0 up
  ip -n "$n" route add default via "10.77.$k.1"
  grep -q "^$addr $h " /etc/hosts || echo "$addr $h $MARK" >> /etc/hosts
  install -d -m 0755 "$etc/geco" "$run" "/var/lib/geco-test-node$k"
  install -d -m 1777 "$(tmp_dir "$k")"
  node_config "$k" > "$etc/geco/geco.toml"
  install -m 0600 /etc/geco/quarantine.key "$etc/geco/quarantine.key"
  install -m 0600 "$STATE/cluster.key" "$etc/geco/cluster.key"
  node_mounts "$k"
}

cluster_files() { # the cluster key all hosts share, and the counting qstat
  [ -s "$STATE/cluster.key" ] || "$GECO" keygen --cluster "$STATE/cluster.key" >/dev/null
  printf '#!/bin/sh\n# geco-test-cluster: count the calls (integration/cluster/cluster.sh)\n%s\n%s\n' \
    "echo \"\$(hostname) \$*\" >> $STATE/qstat.log" "exec $(command -v qstat) \"\$@\"" \
    > "$STATE/qstat"
  chmod 0755 "$STATE/qstat"
  # geco takes qconf (Grid Engine's complex defaults) from beside the configured qstat
  ln -sf "$(command -v qconf)" "$STATE/qconf"
  # each host's two GPUs: device nodes with NVIDIA's numbers (no driver: the kernel answers
  # ENXIO where a job's cgroup allows one, EPERM where it denies it)
  install -d -m 0755 "$STATE/dev"
  [ -c "$STATE/dev/gpu0" ] || mknod -m 0666 "$STATE/dev/gpu0" c 195 0
  [ -c "$STATE/dev/gpu1" ] || mknod -m 0666 "$STATE/dev/gpu1" c 195 1
  touch "$STATE/qstat.log"
}

start_node() { # k: its cores, then its gecod and execd
  local k=$1 h run; h=$(host "$k"); run=$(run_dir "$k")
  # the host's cores: its cpuset made before gecod, which never widens one it finds
  local cd cores; cd=$(cpuset_dir "$k"); cores=$(nproc)
  mkdir -p "$cd"
  cat /sys/fs/cgroup/cpuset/cpuset.mems > "$cd/cpuset.mems"
  echo $(( (k - 1) % cores )) > "$cd/cpuset.cpus"
  # the qmaster caches host names that did not resolve (an earlier `down` removed them):
  # until it sees this one, adding it fails
  local i; for i in $(seq 120); do qconf -ah "$h" >/dev/null 2>&1 && break; sleep 1; done
  gid_range "$k"
  in_node "$k" "$GECO" preload-config -o /etc/geco/preload.conf >/dev/null
  start_gecod "$k"
  start_execd "$k"
  log "$h: $(ip_of "$k"), cpus $(cat "$cd/cpuset.cpus"), gecod pid $(cat "$run/gecod.pid")"
}

gid_range() { # k: the host's own range of Grid Engine's additional group ids
  # Each execd numbers its jobs' additional gids from gid_range, and a shepherd ends by
  # killing every process that has its job's gid: the emulated hosts share one kernel, so
  # with the global range two jobs on two hosts got the same gid, and the end of one killed
  # the other's processes (a real cluster has a kernel per host). A range of its own each.
  local k=$1 f; f=$(mktemp -d)/$(host "$1")
  printf 'gid_range %d-%d\n' $((30000 + 100 * k)) $((30099 + 100 * k)) > "$f"
  qconf -Aconf "$f" >/dev/null 2>&1 || qconf -Mconf "$f" >/dev/null
  rm -rf "$(dirname "$f")"
}

start_execd() { # k: Grid Engine's execd, with geco's preload
  (close_fds; cd / && in_node "$1" env -i PATH="$SYSTEM_PATH" LANG=C.UTF-8 SGE_ROOT="$SGE_ROOT" \
     SGE_CELL="$SGE_CELL" LD_PRELOAD="$PRELOAD" setsid /usr/sbin/sge_execd \
     </dev/null >/dev/null 2>&1)
}

start_gecod() { # k
  local k=$1 run i; run=$(run_dir "$k")
  ! pid_alive "$run/gecod.pid" || die "the gecod of $(host "$k") runs already"
  # EXEC=exec: the background subshell becomes gecod, so $! is gecod's pid
  (close_fds; cd / && EXEC=exec in_node "$k" env -i PATH="$SYSTEM_PATH" LANG=C.UTF-8 setsid "$GECO" daemon \
     </dev/null >>"$run/gecod.log" 2>&1 & echo $! > "$run/gecod.pid")
  for i in $(seq 300); do
    [ -S "$run/gecod-root.sock" ] && in_node "$k" sh -c "ss -Hltn 'sport = :6446' | grep -q ." \
      && return 0
    sleep 0.1
  done
  die "gecod of $(host "$k") did not start: $(tail -5 "$run/gecod.log")"
}

write_hosts_files() { # every namespace resolves the qmaster and every host
  local k all="" master; master=$(qmaster_addr)
  for k in $(nodes_up); do all+="$(ip_of "$k") $(host "$k")"$'\n'; done
  for k in $(nodes_up); do
    printf '127.0.0.1 localhost\n%s %s\n%s' "$master" "$(hostname)" "$all" \
      > "/etc/netns/$(ns "$k")/hosts"
  done
}

complex_up() { # the queue's own FORCED complex: it takes only jobs that ask for it (-l
  # geco_test_cluster=TRUE), never one that names no queue (the demo's, other tests')
  local f
  qconf -sc | grep -q "^$COMPLEX " && return 0
  f=$(mktemp)
  { qconf -sc; echo "$COMPLEX gtc BOOL == FORCED NO FALSE 0"; } > "$f"
  qconf -Mc "$f" >/dev/null
  rm -f "$f"
}

complex_down() { # after the queue that used it is gone
  local f
  qconf -sc 2>/dev/null | grep -q "^$COMPLEX " || return 0
  f=$(mktemp)
  qconf -sc | grep -v "^$COMPLEX " > "$f"
  qconf -Mc "$f" >/dev/null 2>&1 || log "cannot remove the complex $COMPLEX (a queue still uses it?)"
  rm -f "$f"
}

queue_up() { # the hosts of the cluster, a queue (m_mem_free to book per host) and a PE over them
  local k hosts=() tmpdirs="/tmp" f; f=$(mktemp)
  complex_up
  # each host its own tmpdir, as real hosts have their own /tmp: a job's TMPDIR is
  # <tmpdir>/<job>.<task>.<queue> on every host of it, and the execd of the host whose task
  # ends first removes it (with the qrsh exit code files the master's qrsh reads)
  for k in $(nodes_up); do hosts+=("$(host "$k")"); tmpdirs+=",[$(host "$k")=$(tmp_dir "$k")]"; done
  qconf -sp mpi | sed -e "s/^pe_name .*/pe_name $PE/" -e 's/^slots .*/slots 9999/' \
    -e 's/^allocation_rule .*/allocation_rule $round_robin/' > "$f"
  qconf -Ap "$f" >/dev/null 2>&1 || qconf -Mp "$f" >/dev/null
  qconf -sq all.q | sed -e "s/^qname .*/qname $QUEUE/" -e "s/^hostlist .*/hostlist ${hosts[*]}/" \
    -e 's/^slots .*/slots 1/' -e "s/^pe_list .*/pe_list $PE/" -e "s|^tmpdir .*|tmpdir $tmpdirs|" \
    -e "s/^complex_values .*/complex_values m_mem_free=4G,gpu=1,$COMPLEX=TRUE/" \
    -e "s|^prolog .*|prolog $HOOKS_PROLOG|" -e "s|^epilog .*|epilog $HOOKS_EPILOG|" \
    -e "s|^starter_method .*|starter_method $HOOKS_STARTER|" > "$f"
  qconf -Aq "$f" >/dev/null 2>&1 || qconf -Mq "$f" >/dev/null
  rm -f "$f"
}

reports() { # k: qhost shows the host's load (its execd reports)
  qhost -h "$(host "$1")" 2>/dev/null | awk -v h="$(host "$1")" '$1 == h && $4 != "-" { ok = 1 } END { exit !ok }'
}

wait_hosts() { # until qhost reports every host; an execd silent for 30 s is started again
  # once (the qmaster may still hold a connection of the host's previous execd)
  local k i try
  for k in $(nodes_up); do
    for try in 1 2; do
      for i in $(seq 300); do reports "$k" && break; sleep 0.1; done
      reports "$k" && break
      [ "$try" = 2 ] && die "$(host "$k") does not report to the qmaster: $(tail -3 "$SPOOL/$(host "$k")/messages" 2>/dev/null)"
      log "$(host "$k") silent for 30 s: starting its execd again"
      stop_execd "$k"
      start_execd "$k"
    done
  done
}

allows_all() { # k count: until host k's gecod lets in every host (the list it keeps)
  local k=$1 count=$2 j i kept=/var/lib/geco-test-node$1/cluster-hosts
  for i in $(seq 300); do
    for j in $(seq "$count"); do grep -qx "$(ip_of "$j")" "$kept" 2>/dev/null || break; done
    [ "$j" = "$count" ] && grep -qx "$(ip_of "$count")" "$kept" 2>/dev/null && return 0
    sleep 0.1
  done
  die "the gecod of $(host "$k") does not let the cluster's hosts in: $(tail -3 "$(run_dir "$k")/gecod.log")"
}

up() {
  local count=${1:-3} k
  [ "$(id -u)" = 0 ] || die "run as root"
  [ -x "$GECO" ] || die "geco is not installed: run scripts/install.sh first"
  [ -z "$(nodes_up)" ] || die "a cluster is up already ($(nodes_up | paste -sd' ')): run '$0 down' first"
  # the qmaster as it runs (a test session's settings stay; a busy one is waited for, never
  # doubled), else integration/sge's
  if pgrep -x sge_qmaster >/dev/null; then
    local i; for i in $(seq 120); do qconf -sh >/dev/null 2>&1 && break; sleep 1; done
    qconf -sh >/dev/null 2>&1 || die "the running sge_qmaster does not answer"
  else
    bash "$REPO/integration/sge/setup.sh" >/dev/null
  fi
  mkdir -p "$STATE"
  cat /proc/sys/net/ipv4/ip_forward > "$STATE/ip_forward"
  echo 1 > /proc/sys/net/ipv4/ip_forward
  cluster_files
  for k in $(seq "$count"); do net_node "$k"; done
  write_hosts_files
  for k in $(seq "$count"); do start_node "$k"; done
  wait_hosts
  # every gecod lets in the cluster's execution hosts (qconf -sel): now that all of them
  # are, each reads the list again (what an admin does after adding hosts: SIGHUP)
  for k in $(seq "$count"); do kill -HUP "$(cat "$(run_dir "$k")/gecod.pid")"; done
  for k in $(seq "$count"); do allows_all "$k" "$count"; done
  queue_up
  log "up: $count hosts, queue $QUEUE, PE $PE"
}

stop_execd() { # k: the host's execd, by its pid file and by the hostname it runs under (an
  # execd that has not written its pid file yet, or whose spool is gone, is ended too)
  local k=$1 p i
  stop_pid "$SPOOL/$(host "$k")/execd.pid"
  for p in $(pgrep -x sge_execd); do
    [ "$(nsenter -t "$p" -u hostname 2>/dev/null)" = "$(host "$k")" ] || continue
    kill "$p" 2>/dev/null || continue
    for i in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done
}

stop_pid() { # pidfile: end the process it names (ours), wait for it
  local pid i; [ -s "$1" ] || return 0; pid=$(cat "$1")
  kill "$pid" 2>/dev/null || return 0
  for i in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
}

remove_cgroups() { # k: the host's cgroup parent in every hierarchy, job cgroups first
  local k=$1 d
  for d in /sys/fs/cgroup/*/geco-test-node"$k"; do
    [ -d "$d" ] || continue
    find "$d" -mindepth 1 -depth -type d -exec rmdir {} + 2>/dev/null || true
    rmdir "$d" 2>/dev/null || log "cannot remove $d (processes left: $(cat "$d/cgroup.procs" | paste -sd' '))"
  done
}

down_node() { # k
  local k=$1 h; h=$(host "$k")
  stop_execd "$k"
  stop_pid "$(run_dir "$k")/gecod.pid"
  remove_cgroups "$k"
  umount "$(mnt_of "$k")" 2>/dev/null || true  # its mounts (and its jobs' pins) go with it
  qconf -de "$h" >/dev/null 2>&1 || true
  qconf -dconf "$h" >/dev/null 2>&1 || true
  qconf -dh "$h" >/dev/null 2>&1 || true
  rm -rf "${SPOOL:?}/$h" "/etc/netns/$(ns "$k")" "$(run_dir "$k")" "/var/lib/geco-test-node$k" \
    "/var/log/geco-test-node$k" "$(tmp_dir "$k")"
  ip netns del "$(ns "$k")" 2>/dev/null || true
  ip link del "gecotv$k" 2>/dev/null || true
  rm -f "$STATE/node$k"
}

down() {
  local k
  qconf -dq "$QUEUE" >/dev/null 2>&1 || true
  qconf -dp "$PE" >/dev/null 2>&1 || true
  complex_down
  for k in $(nodes_up); do down_node "$k"; done
  # the geco-node<k> lines of /etc/hosts stay (marked): the qmaster caches a host name
  # that stops resolving, and until that entry expires it refuses the host when it comes
  # back and mixes up the connections of the hosts it still hears from
  if [ -s "$STATE/ip_forward" ]; then cat "$STATE/ip_forward" > /proc/sys/net/ipv4/ip_forward; fi
  umount "$STATE/mnt" 2>/dev/null || true
  rm -rf "$STATE"
  log "down"
}

status() {
  local k
  qhost
  for k in $(nodes_up); do
    printf '%s: execd %s, gecod %s\n' "$(host "$k")" \
      "$(pid_alive "$SPOOL/$(host "$k")/execd.pid" && echo up || echo down)" \
      "$(pid_alive "$(run_dir "$k")/gecod.pid" && echo up || echo down)"
  done
}

node_arg() { # k: a host of the cluster, or die
  [ -n "${1:-}" ] && [ -e "$STATE/node$1" ] || die "no host $1 in the cluster (up: $(nodes_up | paste -sd' '))"
}

case "${1:-}" in
  up) up "${2:-3}" ;;
  down) down ;;
  status) status ;;
  stop-gecod) node_arg "${2:-}"; stop_pid "$(run_dir "$2")/gecod.pid"; log "$(host "$2"): gecod stopped" ;;
  start-gecod) node_arg "${2:-}"; start_gecod "$2"; log "$(host "$2"): gecod pid $(cat "$(run_dir "$2")/gecod.pid")" ;;
  run) node_arg "${2:-}"; k=$2; shift 2; EXEC=exec in_node "$k" "$@" ;;
  *) echo "usage: $0 up [N] | status | down | stop-gecod K | start-gecod K | run K command..." >&2; exit 2 ;;
esac
