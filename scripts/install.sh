#!/usr/bin/env bash
# install.sh -- deploy geco from this checkout onto this node (Debian 12, root).
#
#   scripts/install.sh                  what an execution host needs (demo.sh runs this)
#   scripts/install.sh --test           and what the test suite needs (test.sh runs this):
#                                       pytest, ruff, mypy; qemu and debootstrap for the VM
#   scripts/install.sh --print-packages the Debian packages an execution host needs, one a line
#
# Idempotent; a re-run on an installed node only rebuilds and reinstalls geco itself.
#   1. Debian packages (apt-get update + install only when one is missing)
#   2. /opt/geco/venv from the system python (/usr/bin/python3)
#   3. geco (and with --test its [test] extra) into the venv (a normal, non-editable
#      install: what the hooks run as root *and as the job owner*), from a wheel kept in
#      build/wheel until the sources change
#   4. the cffi hwloc extension built in place, for tests that import the checkout
#   5. sge_hooks/* -> /opt/geco/libexec/ (the paths the queue configuration names)
#   6. conf/geco.toml -> /etc/geco/geco.toml, only if there is none yet (on systemd with
#      cgroup v2, with [cgroup] v2_base in geco-jobs.service)
#   7. geco's C programs (the Makefile, built in build/c): the exec() preload (preload/)
#      -> /opt/geco/lib/libgeco_preload.so, sshd's PAM module (pam/) ->
#      /opt/geco/lib/security/pam_geco.so, and the prolog, epilog and starter
#      (hook/geco_hook.c) -> /opt/geco/libexec/{prolog,epilog,starter}
#   8. the quarantine key (/etc/geco/quarantine.key, root-only; made once) and
#      /etc/geco/preload.conf rendered from geco.toml (the preload's view of it)
#   9. with systemd as PID 1: gecod.service and geco-jobs.service installed, gecod
#      enabled and (re)started, and the drop-in that makes sge_execd load the preload
#      (for sgeexecd.service and Debian's gridengine-exec.service); a running execd
#      picks it up at its next restart (running jobs survive that)
#
# Environment: GECO_PREFIX (default /opt/geco) -- only for experiments: the queue
# configuration and the hook wrappers name /opt/geco. GECO_SYSTEM_PACKAGES=1: the venv
# also sees Debian's python3-* packages (python3-lxml, python3-nacl, python3-pip, ...),
# so a node without PyPI installs with what apt gave it.
set -euo pipefail

# Job owners execute the venv and the hooks: nothing we create may be private to root.
umask 022
export DEBIAN_FRONTEND=noninteractive
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
PREFIX=${GECO_PREFIX:-/opt/geco}
VENV=$PREFIX/venv
PY=$VENV/bin/python
# The system interpreter, never a pyenv/conda one from root's PATH: those live under
# /root (unreadable for job owners) and vanish with root's dotfiles.
SYSTEM_PY=/usr/bin/python3

PACKAGES=(
  python3-venv python3-dev gcc pkg-config  # venv + C builds (systemd-python, cffi extension)
  libhwloc-dev hwloc                       # topology (geco._hwloc_cffi, lstopo)
  libsodium-dev make                        # signed wire frames (preload, gecod)
  libpam0g-dev                              # pam_geco.so, sshd's gate into jobs
  libsystemd-dev systemd                   # systemd-python build; journald + journalctl
  netbase procps psmisc util-linux         # /etc/services, ps/pkill, fuser, runuser/setsid
  ca-certificates                          # pip over https
)
TEST_PACKAGES=(
  openssh-server                           # ssh adoption tests
  strace                                   # the quarantine happens before execve
  at cron                                  # the doors out of a job: geco's stray killing
  iproute2                                 # the cluster's hosts in namespaces (integration/cluster)
  qemu-system-x86 qemu-utils debootstrap e2fsprogs  # the systemd + cgroup v2 machine (integration/vm)
)
TEST=no
case "${1:-}" in
  "") ;;
  --test) TEST=yes; PACKAGES+=("${TEST_PACKAGES[@]}") ;;
  --print-packages) printf '%s\n' "${PACKAGES[@]}"; exit 0 ;;
  *) echo "usage: $0 [--test | --print-packages]" >&2; exit 2 ;;
esac

T0=$(date +%s%N)
log() { local ms=$(( ($(date +%s%N) - T0) / 1000000 )); printf '[install %3d.%01ds] %s\n' $((ms / 1000)) $(((ms % 1000) / 100)) "$*"; }
die() { echo "[install] ERROR: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (it installs Debian packages and writes $PREFIX)"
[ -f "$REPO/pyproject.toml" ] || die "no pyproject.toml in $REPO: run the script from a geco checkout"

# One install at a time: two test runs (CI + a developer, two checkouts) would
# otherwise pip into the same venv at once.
mkdir -p /run/lock
exec 9>/run/lock/geco-install.lock
flock 9

TMPD=$(mktemp -d /tmp/geco-install.XXXXXX)
cleanup() {
  [ -n "${POLICY_RC_ADDED:-}" ] && rm -f /usr/sbin/policy-rc.d
  rm -rf "$TMPD"
}
trap cleanup EXIT

# ---------------------------------------------------------------------------
# 1. Debian packages
# ---------------------------------------------------------------------------
# missing_packages, install_packages (no daemon started by a postinst: tests start
# exactly the daemons they need, from a clean environment)
. "$REPO/scripts/packages.sh"
mapfile -t missing < <(missing_packages "${PACKAGES[@]}")
if [ ${#missing[@]} -gt 0 ]; then
  log "packages: installing ${missing[*]}"
  install_packages "$TMPD/apt.log" "${missing[@]}"
  log "packages: done"
else
  log "packages: all ${#PACKAGES[@]} present"
fi

# ---------------------------------------------------------------------------
# 2. venv
# ---------------------------------------------------------------------------
SYSTEM_SITE=false
[ "${GECO_SYSTEM_PACKAGES:-0}" = 1 ] && SYSTEM_SITE=true
venv_ok() {
  [ -x "$PY" ] && grep -qx 'home = /usr/bin' "$VENV/pyvenv.cfg" 2>/dev/null \
    && grep -qx "include-system-site-packages = $SYSTEM_SITE" "$VENV/pyvenv.cfg" \
    && "$PY" -c 'import pip' 2>/dev/null
}
if venv_ok; then
  log "venv: $VENV present ($("$PY" -V 2>&1))"
else
  # a venv made from another interpreter (or half-made) is replaced, not patched
  [ -e "$VENV" ] && log "venv: $VENV not made from $SYSTEM_PY as asked (or broken): recreating"
  rm -rf "$VENV"
  mkdir -p "$PREFIX"
  if [ "$SYSTEM_SITE" = true ] && "$SYSTEM_PY" -c 'import pip' 2>/dev/null; then
    # Debian's pip serves the venv too (ensurepip is the slow half of making a venv)
    "$SYSTEM_PY" -m venv --system-site-packages --without-pip "$VENV"
  elif [ "$SYSTEM_SITE" = true ]; then
    "$SYSTEM_PY" -m venv --system-site-packages "$VENV"
  else
    "$SYSTEM_PY" -m venv "$VENV"
  fi
  log "venv: created $VENV from $SYSTEM_PY ($("$PY" -V 2>&1))"
fi

# ---------------------------------------------------------------------------
# 3. geco into the venv
# ---------------------------------------------------------------------------
# pip is used with whatever configuration this node has (index mirrors, find-links,
# constraints in /etc/pip.conf, /etc/xdg/pip, ~/.config/pip, PIP_*): an admin's
# mirror settings are to be honoured, and nothing here depends on them.
pip() { "$PY" -m pip --disable-pip-version-check "$@"; }

# Build requirements and runtime + test requirements come from pyproject.toml, so
# they are written down once. They are installed as plain requirements (a no-op
# when satisfied); geco itself is then built without build isolation from the
# venv's own setuptools/cffi: no per-run download of a build environment.
"$PY" - "$REPO/pyproject.toml" "$TEST" > "$TMPD/reqs.txt" <<'EOF'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    meta = tomllib.load(f)
reqs = list(meta.get("build-system", {}).get("requires", []))
reqs += meta["project"].get("dependencies", [])
if sys.argv[2] == "yes":
    reqs += meta["project"].get("optional-dependencies", {}).get("test", [])
print("\n".join(dict.fromkeys(reqs)))  # once each, in order
EOF
log "pip: requirements ($(paste -sd' ' "$TMPD/reqs.txt"))"
pip install -q -r "$TMPD/reqs.txt" >"$TMPD/pip.log" 2>&1 \
  || { cat "$TMPD/pip.log" >&2; die "pip install of the requirements failed"; }

# Built in a copy: an in-tree build leaves build/ and *.egg-info behind in the
# checkout, and two runs at once (two checkouts, CI + a developer) would share them.
# The wheel is kept in build/wheel with the digest of the sources it was built from: a
# copy of this checkout (the QEMU test machine's) installs it instead of compiling
# geco's cffi extensions again, ~1 minute under emulation.
mkdir -p "$TMPD/src"
tar -C "$REPO" --exclude=./.git --exclude=./build --exclude=./.venv --exclude='*.so' \
    --exclude='*.o' --exclude=__pycache__ --exclude='*.egg-info' --exclude=./.mypy_cache \
    --exclude=./.ruff_cache --exclude=./.hypothesis --exclude=./.pytest_cache \
    --exclude=./preload/build -cf - . | tar -C "$TMPD/src" -xf -
WHEELS=$REPO/build/wheel
digest=$(tar -C "$TMPD/src" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
           -cf - . | sha256sum | cut -d' ' -f1)
wheel=$(find "$WHEELS" -maxdepth 1 -name 'geco-*.whl' -print -quit 2>/dev/null || true)
if [ -n "$wheel" ] && [ "$(cat "$WHEELS/sources.sha256" 2>/dev/null)" = "$digest" ]; then
  log "pip: installing geco from $wheel (built from these sources)"
else
  log "pip: building geco from $REPO"
  rm -rf "$WHEELS" && mkdir -p "$WHEELS"
  pip wheel -q --no-deps --no-build-isolation -w "$WHEELS" "$TMPD/src" >"$TMPD/pip.log" 2>&1 \
    || { cat "$TMPD/pip.log" >&2; die "pip could not build geco"; }
  echo "$digest" > "$WHEELS/sources.sha256"
  wheel=$(find "$WHEELS" -maxdepth 1 -name 'geco-*.whl' -print -quit)
fi
pip install -q --no-deps --force-reinstall "$wheel" >"$TMPD/pip.log" 2>&1 \
  || { cat "$TMPD/pip.log" >&2; die "pip install of geco failed"; }
log "pip: geco $("$PY" -c 'import importlib.metadata as m; print(m.version("geco"))') installed"

# ---------------------------------------------------------------------------
# 4. in-place extension for tests that import the checkout
# ---------------------------------------------------------------------------
# The ones pip just built from the same sources, copied (staged, then renamed: a running
# gecod or test session keeps the file it mapped); a builder whose module pip did not
# build (geco/_<x>_build.py makes geco._<x>_cffi) compiles it in place. A second
# compile costs ~2 s here and ~20 s in an emulated guest.
SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
SUFFIX=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
for builder in "$REPO"/geco/_*_build.py; do
  [ -f "$builder" ] || continue
  module="geco.$(basename "$builder" .py)"
  name="$(basename "$builder" _build.py)_cffi"
  built=$(find "$SITE/geco" -maxdepth 1 -name "$name.*so" -print -quit)
  if [ -n "$built" ]; then
    install -m 0644 "$built" "$REPO/geco/.$name$SUFFIX.new"
    mv -f "$REPO/geco/.$name$SUFFIX.new" "$REPO/geco/$name$SUFFIX"
    log "extension: $REPO/geco/$name$SUFFIX (pip's build)"
    continue
  fi
  (cd "$REPO" && "$PY" -m "$module" >"$TMPD/build.log" 2>&1) \
    || { cat "$TMPD/build.log" >&2; die "in-place build of $module failed"; }
  log "extension: $(tail -n 1 "$TMPD/build.log")"
done

# ---------------------------------------------------------------------------
# 5. hooks
# ---------------------------------------------------------------------------
if [ -d "$REPO/sge_hooks" ] && [ -n "$(ls -A "$REPO/sge_hooks")" ]; then
  install -d -m 0755 "$PREFIX/libexec"
  for f in "$REPO"/sge_hooks/*; do
    [ -f "$f" ] && install -m 0755 "$f" "$PREFIX/libexec/"
  done
  # a hook removed from the repo must not stay configured-and-running on the node
  # (the prolog, epilog and starter are built from hook/geco_hook.c, in step 7)
  for f in "$PREFIX"/libexec/*; do
    case $(basename "$f") in prolog|epilog|starter) continue ;; esac
    [ -f "$f" ] && [ ! -e "$REPO/sge_hooks/$(basename "$f")" ] \
      && rm -f "$f" && log "hooks: removed stale $f"
  done
  log "hooks: $(cd "$PREFIX/libexec" && ls | paste -sd' ') in $PREFIX/libexec"
fi

# ---------------------------------------------------------------------------
# 6. configuration
# ---------------------------------------------------------------------------
# systemd as PID 1 (sd_booted) and a pure cgroup v2: job cgroups go into the
# delegated geco-jobs.service, where systemd leaves geco's controllers and limits alone;
# with cgroup v1, job processes go there in systemd's own hierarchies, so systemd never
# moves them out of geco's v1 cgroups
SYSTEMD=no
[ -d /run/systemd/system ] && SYSTEMD=yes
JOBS_BASE=/sys/fs/cgroup/system.slice/geco-jobs.service/jobs
V1_SYSTEMD_BASE=/system.slice/geco-jobs.service/jobs  # a cgroup path: v1 under systemd
if [ -f "$REPO/conf/geco.toml" ]; then
  if [ -e /etc/geco/geco.toml ]; then
    log "config: /etc/geco/geco.toml kept (exists)"
  elif [ "$SYSTEMD" = yes ] && [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then
    install -d -m 0755 /etc/geco
    sed "s|^v2_base = \"\"|v2_base = \"$JOBS_BASE\"|" "$REPO/conf/geco.toml" > /etc/geco/geco.toml
    grep -q "^v2_base = \"$JOBS_BASE\"" /etc/geco/geco.toml || die "conf/geco.toml has no v2_base line"
    log "config: installed /etc/geco/geco.toml (cgroup v2 under systemd: v2_base in geco-jobs.service)"
  elif [ "$SYSTEMD" = yes ]; then
    install -d -m 0755 /etc/geco
    sed "s|^v1_systemd_base = \"\"|v1_systemd_base = \"$V1_SYSTEMD_BASE\"|" "$REPO/conf/geco.toml" > /etc/geco/geco.toml
    grep -q "^v1_systemd_base = \"$V1_SYSTEMD_BASE\"" /etc/geco/geco.toml || die "conf/geco.toml has no v1_systemd_base line"
    log "config: installed /etc/geco/geco.toml (cgroup v1 under systemd: job processes also in geco-jobs.service)"
  else
    install -D -m 0644 "$REPO/conf/geco.toml" /etc/geco/geco.toml
    log "config: installed /etc/geco/geco.toml"
  fi
fi

# ---------------------------------------------------------------------------
# 7. the C programs: the exec() preload for sge_execd and sshd, pam_geco.so, the hooks
# ---------------------------------------------------------------------------
if [ -f "$REPO/Makefile" ]; then
  make -s -C "$REPO" install PREFIX="$PREFIX" >"$TMPD/make.log" 2>&1 \
    || { cat "$TMPD/make.log" >&2; die "building geco's C programs failed"; }
  log "preload: $PREFIX/lib/libgeco_preload.so; PAM module: $PREFIX/lib/security/pam_geco.so"
fi

# ---------------------------------------------------------------------------
# 8. quarantine key (made once per node; every node of a cluster may have its own)
#    and the preload's configuration, rendered from geco.toml every time
# ---------------------------------------------------------------------------
if [ -f "$REPO/geco/wire/keys.py" ]; then
  if [ -e /etc/geco/quarantine.key ]; then
    log "key: /etc/geco/quarantine.key kept (exists)"
  else
    "$VENV/bin/geco" keygen >/dev/null && log "key: generated /etc/geco/quarantine.key (0600)"
  fi
  # the cluster key must be the same file on every host of a cluster: copy one over this
  if [ -e /etc/geco/cluster.key ]; then
    log "key: /etc/geco/cluster.key kept (exists)"
  else
    "$VENV/bin/geco" keygen --cluster >/dev/null \
      && log "key: generated /etc/geco/cluster.key (0600; copy ONE such file to every host)"
  fi
  "$VENV/bin/geco" preload-config -o /etc/geco/preload.conf >/dev/null \
    && log "preload config: /etc/geco/preload.conf"
fi

# Whatever umask pip or an earlier run used: job owners must read and execute it all.
chmod -R a+rX "$PREFIX"

# ---------------------------------------------------------------------------
# 9. systemd: gecod, the job subtree, and sge_execd with the preload
# ---------------------------------------------------------------------------
if [ "$SYSTEMD" = yes ]; then
  install -m 0644 "$REPO/conf/gecod.service" "$REPO/conf/geco-jobs.service" /etc/systemd/system/
  # the upstream unit name (SGE/OCS templates) and Debian's (its init script)
  for unit in sgeexecd.service gridengine-exec.service; do
    install -D -m 0644 "$REPO/conf/systemd/gridengine-exec.service.d/geco-preload.conf" \
      "/etc/systemd/system/$unit.d/geco-preload.conf"
  done
  systemctl daemon-reload
  systemctl enable --quiet gecod.service
  # a restart picks up the new geco; jobs live in geco-jobs.service and stay
  systemctl restart gecod.service || die "gecod did not start: $(journalctl -u gecod -n 5 --no-pager)"
  log "systemd: gecod.service enabled and running, jobs in geco-jobs.service, execd drop-ins" \
    "(a running sge_execd loads the preload at its next restart)"
fi
log "done"
