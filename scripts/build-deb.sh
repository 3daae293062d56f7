#!/usr/bin/env bash
# build-deb.sh -- build geco's Debian package from this checkout (Debian 12).
#
#   scripts/build-deb.sh [OUTDIR]     -> OUTDIR/geco_<version>_<arch>.deb (default build/deb)
#
# dpkg-buildpackage in a copy of the sources (an in-tree build leaves debian/geco,
# build/ and *.egg-info behind, and two builds at once would share them). The package
# is kept with the digest of the sources it was built from: a second call with the
# same sources only prints its path. Needs the Build-Depends of debian/control
# (scripts/install.sh installs them); prints the package's path on its last line.
set -euo pipefail
export LC_ALL=C.UTF-8 DEBIAN_FRONTEND=noninteractive
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
OUT=$(mkdir -p "${1:-$REPO/build/deb}" && cd "${1:-$REPO/build/deb}" && pwd -P)

TMPD=$(mktemp -d /tmp/geco-deb.XXXXXX)
trap 'rm -rf "$TMPD"' EXIT
mkdir "$TMPD/geco"
tar -C "$REPO" --exclude=./.git --exclude=./build --exclude=./.venv --exclude='*.so' \
    --exclude='*.o' --exclude=__pycache__ --exclude='*.egg-info' --exclude=./.mypy_cache \
    --exclude=./.ruff_cache --exclude=./.hypothesis --exclude=./.pytest_cache \
    --exclude=./preload/build --exclude=./debian/geco --exclude=./debian/.build \
    --exclude=./debian/.debhelper -cf - . | tar -C "$TMPD/geco" -xf -
digest=$(tar -C "$TMPD/geco" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
           -cf - . | sha256sum | cut -d' ' -f1)
deb=$(find "$OUT" -maxdepth 1 -name 'geco_*.deb' -print -quit)
if [ -n "$deb" ] && [ "$(cat "$OUT/sources.sha256" 2>/dev/null)" = "$digest" ]; then
  echo "$deb"
  exit 0
fi
(cd "$TMPD/geco" && dpkg-buildpackage -us -uc -b) >"$TMPD/build.log" 2>&1 \
  || { tail -n 40 "$TMPD/build.log" >&2; echo "build-deb: dpkg-buildpackage failed" >&2; exit 1; }
rm -f "$OUT"/geco_*.deb "$OUT/sources.sha256"
cp "$TMPD"/geco_*.deb "$OUT/"
echo "$digest" > "$OUT/sources.sha256"
find "$OUT" -maxdepth 1 -name 'geco_*.deb' -print -quit
