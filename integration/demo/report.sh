# shellcheck shell=bash
# report.sh -- sourced by the demo jobs: where does this job run, and within which limits?
# Reads only what the kernel says about this very process.

# bytes -> "1536M"; the kernel's "no limit" values -> "unlimited"
human() {
  case "$1" in
    max | '') echo unlimited ;;
    *) if [ "$1" -ge 4611686018427387904 ]; then echo unlimited; else echo "$(( $1 / 1048576 ))M"; fi ;;
  esac
}

# the memory limit of this process's memory cgroup (cgroup v1 or v2)
memory_limit() {
  local v1 v2 d
  v1=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ {print $3}' /proc/$$/cgroup)
  if [ -n "$v1" ] && [ -r "/sys/fs/cgroup/memory$v1/memory.limit_in_bytes" ]; then
    d=/sys/fs/cgroup/memory$v1
    printf 'RAM %s' "$(human "$(cat "$d/memory.limit_in_bytes")")"
    [ -r "$d/memory.memsw.limit_in_bytes" ] && printf ', RAM+swap %s' "$(human "$(cat "$d/memory.memsw.limit_in_bytes")")"
    printf '  (cgroup v1 memory:%s)\n' "$v1"
    return
  fi
  v2=$(awk -F: '$1 == "0" {print $3}' /proc/$$/cgroup)
  d=/sys/fs/cgroup$v2
  if [ -r "$d/memory.max" ]; then
    printf 'RAM %s, swap %s  (cgroup v2 %s)\n' "$(human "$(cat "$d/memory.max")")" \
      "$(human "$(cat "$d/memory.swap.max" 2>/dev/null)")" "$v2"
  else
    echo "unknown (no memory cgroup found)"
  fi
}

report() {
  local task=""
  [ "${SGE_TASK_ID:-undefined}" != undefined ] && task=" task $SGE_TASK_ID"
  echo "job $JOB_ID$task ($JOB_NAME) on $(hostname), $NSLOTS slot(s), pid $$, user $(id -un)"
  echo "  cgroups:"
  grep -E '^[0-9]+:([^:]*,)?(cpuset|memory)(,[^:]*)?:|^0::' /proc/$$/cgroup | sed 's/^/    /'
  echo "  allowed CPUs: $(awk '/^Cpus_allowed_list/ {print $2}' /proc/$$/status) of $(nproc --all) on this host"
  echo "  memory limit: $(memory_limit)"
}
