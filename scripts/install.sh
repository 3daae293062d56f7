#!/usr/bin/env bash
# install.sh -- put geco from this checkout on this node (Debian 12, root), the one way
# geco is laid out: its Debian package.
#
#   scripts/install.sh                  what an execution host needs (demo.sh runs this)
#   scripts/install.sh --test           and what the test suite needs (test.sh runs this)
#   scripts/install.sh --print-packages the Debian packages an execution host needs, one a
#                                       line (the package's Depends name the same)
#
# Idempotent; a re-run rebuilds the package only when the sources changed.
#   1. Debian packages: what the package is built with (debian/control's Build-Depends),
#      what it runs on, and with --test the suite's (apt-get update + install only when
#      one is missing)
#   2. the package, built by scripts/build-deb.sh into build/deb (kept until the sources
#      change) and installed with apt: its maintainer scripts make /etc/geco/geco.toml
#      (once), the quarantine key (once), /etc/geco/preload.conf, and with systemd as
#      PID 1 enable and (re)start gecod (README, "The package")
#   3. the cluster key, made once when none exists (this machine's emulated hosts share
#      /etc; on a real cluster the admin copies ONE key to every host)
#   4. with --test: /opt/geco-dev/venv, the suite's tools (pytest, hypothesis, ruff, mypy)
#      over Debian's python3 and its packages (geco's dependencies, as the package runs
#      on them), and geco's two cffi extensions as the package built them, copied into
#      the checkout (the tests import geco from it)
#
# Environment: GECO_DEB=path: install that package instead of building one.
set -euo pipefail

# Job owners run what the checkout holds (the tests' helpers): nothing private to root.
umask 022
export DEBIAN_FRONTEND=noninteractive
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
DEV=/opt/geco-dev/venv
# The system interpreter, never a pyenv/conda one from root's PATH: those live under
# /root (unreadable for job owners) and vanish with root's dotfiles.
SYSTEM_PY=/usr/bin/python3

PACKAGES=(
  python3 python3-lxml python3-nacl python3-systemd python3-cffi-backend  # geco (Depends)
  libsodium23 libhwloc15 libpam0g          # the preload, the PAM module, the hooks
  systemd                                  # journald + journalctl
  netbase procps psmisc util-linux         # /etc/services, ps/pkill, fuser, runuser/setsid
)
BUILD_PACKAGES=(
  debhelper dh-python python3-all-dev python3-setuptools python3-cffi  # debian/control
  libhwloc-dev libsodium-dev libpam0g-dev pkg-config gcc make dpkg-dev
)
TEST_PACKAGES=(
  python3-venv ca-certificates             # the suite's tools from PyPI
  lintian                                  # the package's own check
  hwloc                                    # hwloc-calc: the topology tests' second opinion
  openssh-server                           # ssh adoption tests
  strace                                   # the quarantine happens before execve
  at cron                                  # the doors out of a job: geco's stray killing
  iproute2                                 # the cluster's hosts in namespaces (integration/cluster)
  qemu-system-x86 qemu-utils debootstrap e2fsprogs  # the systemd + cgroup v2 machine (integration/vm)
  python3-prometheus-client prometheus     # gecod's metrics, scraped by a real Prometheus
  python3-matplotlib                       # geco usage --plot (PNG/SVG)
)
TEST=no
case "${1:-}" in
  "") ;;
  --test) TEST=yes; PACKAGES+=("${TEST_PACKAGES[@]}") ;;
  --print-packages) printf '%s\n' "${PACKAGES[@]}"; exit 0 ;;
  *) echo "usage: $0 [--test | --print-packages]" >&2; exit 2 ;;
esac
[ -n "${GECO_DEB:-}" ] || PACKAGES+=("${BUILD_PACKAGES[@]}")

T0=$(date +%s%N)
log() { local ms=$(( ($(date +%s%N) - T0) / 1000000 )); printf '[install %3d.%01ds] %s\n' $((ms / 1000)) $(((ms % 1000) / 100)) "$*"; }
die() { echo "[install] ERROR: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (it installs Debian packages)"
[ -f "$REPO/debian/control" ] || die "no debian/control in $REPO: run the script from a geco checkout"

# One install at a time: two test runs (CI + a developer, two checkouts) would
# otherwise install into the same places at once.
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
# geco's own postinst starts gecod where systemd runs: that one is wanted
if [ -n "${POLICY_RC_ADDED:-}" ]; then
  rm -f /usr/sbin/policy-rc.d
  POLICY_RC_ADDED=
fi

# ---------------------------------------------------------------------------
# 2. the package
# ---------------------------------------------------------------------------
# What an install.sh from before the package left: files under /opt/geco, and units in
# /etc/systemd/system that would shadow the package's.
for legacy in /etc/systemd/system/gecod.service /etc/systemd/system/geco-jobs.service \
              /etc/systemd/system/sgeexecd.service.d/geco-preload.conf \
              /etc/systemd/system/gridengine-exec.service.d/geco-preload.conf /opt/geco; do
  if [ -e "$legacy" ]; then
    rm -rf "$legacy"
    log "legacy: removed $legacy (the package's layout replaces it)"
  fi
done

if [ -n "${GECO_DEB:-}" ]; then
  deb=$(realpath "$GECO_DEB")
else
  log "package: building (scripts/build-deb.sh; kept in build/deb until the sources change)"
  deb=$("$REPO/scripts/build-deb.sh" | tail -n 1) || die "the package did not build"
fi
version=$(dpkg-deb -f "$deb" Version)
# --reinstall: a package rebuilt with the same version still replaces the installed one
apt-get install -y -q --reinstall --no-install-recommends "$deb" >"$TMPD/apt.log" 2>&1 \
  || { cat "$TMPD/apt.log" >&2; die "apt-get install $deb failed"; }
{ grep '^geco: ' "$TMPD/apt.log" || true; } | while read -r line; do log "package: ${line#geco: }"; done
log "package: geco $version installed from $deb"

# ---------------------------------------------------------------------------
# 3. the cluster key
# ---------------------------------------------------------------------------
if [ ! -e /etc/geco/cluster.key ]; then
  geco keygen --cluster >/dev/null \
    && log "key: generated /etc/geco/cluster.key (0600; copy ONE such file to every host)"
fi

# ---------------------------------------------------------------------------
# 4. the suite's tools, and geco's extensions in the checkout
# ---------------------------------------------------------------------------
if [ "$TEST" = yes ]; then
  if ! { [ -x "$DEV/bin/python" ] && grep -qx 'home = /usr/bin' "$DEV/pyvenv.cfg" \
         && grep -qx 'include-system-site-packages = true' "$DEV/pyvenv.cfg" \
         && "$DEV/bin/python" -c 'import pip' 2>/dev/null; }; then
    rm -rf "$DEV"
    mkdir -p "$(dirname "$DEV")"
    "$SYSTEM_PY" -m venv --system-site-packages "$DEV"
    log "venv: created $DEV over $SYSTEM_PY and Debian's python3 packages"
  fi
  # the [test] extra of pyproject.toml; pip with whatever configuration this node has
  "$SYSTEM_PY" -c 'import sys, tomllib
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]["test"]))' \
    "$REPO/pyproject.toml" > "$TMPD/reqs.txt"
  "$DEV/bin/python" -m pip --disable-pip-version-check install -q -r "$TMPD/reqs.txt" \
      >"$TMPD/pip.log" 2>&1 || { cat "$TMPD/pip.log" >&2; die "pip install of the suite's tools failed"; }
  log "venv: $(paste -sd' ' "$TMPD/reqs.txt")"
  # staged, then renamed: a running gecod or test session keeps the file it mapped; one
  # built for this interpreter alone (an earlier in-place build) would shadow abi3's
  rm -f "$REPO"/geco/_*_cffi.cpython-*.so
  for built in /usr/lib/python3/dist-packages/geco/_*_cffi*.so; do
    name=$(basename "$built")
    install -m 0644 "$built" "$REPO/geco/.$name.new"
    mv -f "$REPO/geco/.$name.new" "$REPO/geco/$name"
  done
  log "extensions: geco's cffi extensions copied from the package into $REPO/geco"
fi
log "done"
