"""geco's Debian package for the tests: the suite's build, what is in it, another version.

``scripts/install.sh`` (``./test.sh``'s first step) builds the package into ``build/deb``
with ``scripts/build-deb.sh``; the QEMU guests get that directory with their copy of
the checkout and install the package with apt, as a node would.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

__all__ = ["DEB_DIR", "REPO", "apt", "built", "contents", "field", "installed_version",
           "with_version"]

REPO = Path(__file__).resolve().parents[1]
DEB_DIR = REPO / "build" / "deb"
APT_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
           "DEBIAN_FRONTEND": "noninteractive"}


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


def installed_version() -> str:
    """The installed geco's version, "" when none is installed (removed or never)."""
    out = subprocess.run(["dpkg-query", "-W", "-f=${Status} ${Version}", "geco"],
                         capture_output=True, text=True, check=False).stdout.split()
    return out[-1] if out[:3] == ["install", "ok", "installed"] and len(out) == 4 else ""
