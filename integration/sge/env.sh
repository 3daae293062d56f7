# env.sh -- sourced by the scripts (and read by the tests) that drive the test bench's Grid
# Engine: its environment as a site's settings.sh gives it to its users, with Grid Engine's
# own clients first in PATH. Debian's /usr/bin/q* wrappers find the architecture with
# util/arch at every call, ~45 processes with the C preprocessor among them: ~0.15 s a
# command on the host, ~4 s on the emulated test machine, where every qconf of setup.sh
# and every qsub, qstat and qacct a test waits on paid it.
export SGE_ROOT=/var/lib/gridengine SGE_CELL=default
case $(uname -m) in  # util/arch's names; Debian links each to /usr/lib/gridengine
  x86_64) export SGE_ARCH=lx-amd64 ;;
  aarch64) export SGE_ARCH=lx-arm64 ;;
  *) unset SGE_ARCH ;;  # no bin dir named for it: the wrappers in PATH serve
esac
export PATH=${SGE_ARCH:+$SGE_ROOT/bin/$SGE_ARCH:}${PATH:-/usr/sbin:/usr/bin:/sbin:/bin}
