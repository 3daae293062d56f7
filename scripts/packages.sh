# packages.sh -- sourced by scripts/install.sh and integration/sge/setup.sh: the Debian
# packages a script needs, installed without letting their postinsts start daemons.
# The caller defines die(), and on exit removes /usr/sbin/policy-rc.d when
# POLICY_RC_ADDED is set.

# missing_packages NAME...: the ones dpkg does not have installed, one a line
missing_packages() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || echo "$p"
  done
}

# install_packages LOG NAME...: apt-get update, then install NAME..., their output in LOG
# (shown on failure). Package postinsts (openssh-server, gridengine's, exim4) would start
# their daemons through invoke-rc.d; the callers start exactly the daemons they need,
# cleanly, so a policy forbids that until the caller exits.
install_packages() {
  local log=$1
  shift
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 0755 /usr/sbin/policy-rc.d
    POLICY_RC_ADDED=1
  fi
  apt-get update -q >"$log" 2>&1 || { cat "$log" >&2; die "apt-get update failed"; }
  apt-get install -y -q --no-install-recommends "$@" >>"$log" 2>&1 \
    || { cat "$log" >&2; die "apt-get install $* failed"; }
}
