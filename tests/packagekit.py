"""geco's Debian package for the tests: the suite's build, what is in it, another version.

``scripts/install.sh`` (``./test.sh``'s first step) builds the package into ``build/deb``
with ``scripts/build-deb.sh``; the QEMU guests get that directory with their copy of
the checkout and install the package with apt, as a node would.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

__all__ = ["DEB_DIR", "EMULATED_REQUEST_TIMEOUT", "REPO", "apt", "built", "contents", "field",
           "fit_to_emulated_cpu", "installed_version", "with_version"]

REPO = Path(__file__).resolve().parents[1]
DEB_DIR = REPO / "build" / "deb"
APT_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
           "DEBIAN_FRONTEND": "noninteractive"}
# [gecod] request_timeout in the QEMU guests. geco's 10 s is for hardware, where a job
# start's containment (its qstat included) takes ~15 ms, ~2 s at worst on the host under
# the suite (GECO_EVENT=quarantined, ELAPSED_MS). The guests' CPU is emulated, ~8x slower
# and shared with the host's tests: there one start took over 10 s, the preload refused
# the shepherd's exec and Grid Engine ran the job a second time. An admin whose qmaster
# answers slowly sets it the same way (conf/geco.toml says so).
EMULATED_REQUEST_TIMEOUT = 60.0


def built() -> Path:
    """The package the suite built (``build/deb/geco_<version>_<arch>.deb``)."""
    found = sorted(DEB_DIR.glob("geco_*.deb"))
    if len(found) != 1:
        raise AssertionError(f"expected one geco package in {DEB_DIR} (scripts/install.sh "
                             f"builds it), found {[p.name for p in found]}")
    return found[0]


def field(deb: Path, name: str) -> str:
    """One field of the package's control file (``Version``, ``Depends``...)."""
    return subprocess.run(["dpkg-deb", "-f", str(deb), name], capture_output=True, text=True,
                          check=True).stdout.strip()


def contents(deb: Path) -> dict[str, str]:
    """The package's paths (``/usr/bin/geco``), each with its type: ``d``, ``-`` or ``l``
    (a link with `` -> target``)."""
    out = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True,
                         check=True).stdout
    found = {}
    for line in out.splitlines():
        words = line.split()
        path = words[5].removeprefix(".").rstrip("/") or "/"
        found[path] = " ".join([words[0][0], *words[6:]])
    return found


def with_version(deb: Path, version: str, out_dir: Path) -> Path:
    """The same package as another version (its control file's Version changed): what an
    upgrade or a downgrade replaces, file by file, through the maintainer scripts."""
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["dpkg-deb", "-R", str(deb), str(tree)], check=True)
        control = tree / "DEBIAN" / "control"
        control.write_text("".join(f"Version: {version}\n" if line.startswith("Version:")
                                   else line for line in control.read_text().splitlines(True)))
        out = out_dir / f"geco_{version}_{field(deb, 'Architecture')}.deb"
        # gzip, fast: the guest's CPU is emulated
        subprocess.run(["dpkg-deb", "-Zgzip", "-z1", "--build", str(tree), str(out)],
                       check=True, capture_output=True)
    return out


def apt(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``apt-get -y -q ARGS`` as an admin runs it (its output in the result, not checked)."""
    return subprocess.run(["apt-get", "-y", "-q", "--no-install-recommends", *args],
                          capture_output=True, text=True, env=APT_ENV, timeout=timeout,
                          check=False)


def fit_to_emulated_cpu(conf: Path = Path("/etc/geco/geco.toml")) -> None:
    """Give the installed node's preload :data:`EMULATED_REQUEST_TIMEOUT`, as an admin
    would: the setting in geco.toml, then ``geco preload-config``; sge_execd's preload reads
    it when execd (re)starts, after this."""
    text = conf.read_text()
    fitted, count = re.subn(r"(?m)^request_timeout = .*$",
                            f"request_timeout = {EMULATED_REQUEST_TIMEOUT}", text)
    if count != 1:
        raise AssertionError(f"{conf}: expected one request_timeout line, found {count}")
    conf.write_text(fitted)
    subprocess.run(["geco", "preload-config", "-o", str(conf.parent / "preload.conf")],
                   check=True, capture_output=True, env={**APT_ENV, "GECO_CONFIG": str(conf)},
                   timeout=600)


def installed_version() -> str:
    """The installed geco's version, "" when none is installed (removed or never)."""
    out = subprocess.run(["dpkg-query", "-W", "-f=${Status} ${Version}", "geco"],
                         capture_output=True, text=True, check=False).stdout.split()
    return out[-1] if out[:3] == ["install", "ok", "installed"] and len(out) == 4 else ""
