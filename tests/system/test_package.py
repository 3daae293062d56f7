"""geco's Debian package, on the host: it builds from the tree, lintian finds nothing, it
needs nothing but Debian's packages at run time, and its files are where the README says.

The package is the suite's own (``scripts/install.sh`` builds it with
``scripts/build-deb.sh`` and installs it before the tests); its life on a node with jobs
(install, upgrade, removal, purge) runs in the QEMU machine
(tests/vm_sge/test_package_lifecycle.py); an upgrade and a downgrade under a running job
on this host too (tests/integration/test_package_upgrade_interactive.py).
"""

from __future__ import annotations

import fnmatch
import re
import subprocess
import tomllib
from pathlib import Path

import geco
from tests import packagekit

REPO = packagekit.REPO
BUILD_DEB = REPO / "scripts" / "build-deb.sh"
TABLE = "### The package: what goes where"


def build(out_dir: Path) -> Path:
    """The package built from the tree by ``scripts/build-deb.sh`` into ``out_dir`` (not
    build/deb: the QEMU guests copy that one while the host's tests run)."""
    out = subprocess.run([str(BUILD_DEB), str(out_dir)], capture_output=True, text=True,
                         timeout=900, check=False)
    assert out.returncode == 0, out.stderr
    return Path(out.stdout.splitlines()[-1])


def readme_paths() -> list[str]:
    """The paths of the README's table of the package's files (a trailing / is a tree)."""
    section = (REPO / "README.md").read_text().split(TABLE, 1)[1].split("\n#", 1)[0]
    return re.findall(r"^\| `(/[^`]*)` \|", section, re.M)


def test_the_package_builds_from_the_tree_and_lintian_finds_nothing(
        tmp_path: Path, figures: list[str]) -> None:
    """Given the tree, scripts/build-deb.sh gives geco_<version>_<arch>.deb with the files
    of the suite's own build, lintian reports no warning or error on it (each override in
    debian/ says why), and its version is the one pyproject.toml, geco.__version__ and
    debian/changelog give."""
    deb = build(tmp_path)
    assert packagekit.contents(deb) == packagekit.contents(packagekit.built())
    checked = subprocess.run(["lintian", "--fail-on", "warning,error", str(deb)],
                             capture_output=True, text=True, timeout=600, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    with (REPO / "pyproject.toml").open("rb") as f:
        version = tomllib.load(f)["project"]["version"]
    changelog = (REPO / "debian" / "changelog").read_text().split("\n", 1)[0]
    assert packagekit.field(deb, "Version") == geco.__version__ == version, changelog
    assert changelog.startswith(f"geco ({version}) "), changelog
    figures.append(f"package: {deb.name} {deb.stat().st_size / 1024:.0f} KiB, installed "
                   f"{int(packagekit.field(deb, 'Installed-Size')) / 1024:.1f} MiB")


def test_it_runs_on_debian_packages_alone() -> None:
    """Given the package's Depends, each is a Debian package an execution host gets
    (scripts/install.sh --print-packages, which the QEMU image holds) or what Python and
    libc bring; none is a compiler or a -dev package."""
    depends = packagekit.field(packagekit.built(), "Depends")
    names = {re.split(r"[ :(]", d.strip().split("|")[0].strip(), maxsplit=1)[0]
             for d in depends.split(",")}
    host = set(subprocess.run([str(REPO / "scripts" / "install.sh"), "--print-packages"],
                              capture_output=True, text=True, check=True).stdout.split())
    assert not {n for n in names if n.endswith("-dev") or n in ("gcc", "cc", "make")}, names
    brought = {"libc6", "python3"} | {n for n in names
                                      if n.startswith("python3-cffi-backend-api-")}
    assert names - brought <= host, names - brought - host
    assert {"python3-lxml", "python3-nacl", "python3-systemd", "libsodium23",
            "libhwloc15"} <= names, names


def test_its_files_are_where_the_readme_says() -> None:
    """Given the README's table of the package's files, every path in it is in the
    package, and every file of the package is in it (itself, or under a tree it names)."""
    shipped = packagekit.contents(packagekit.built())
    documented = readme_paths()
    assert documented, f"no table under {TABLE!r} in README.md"
    for path in documented:
        pattern = path.rstrip("/")
        assert fnmatch.filter(shipped, pattern), f"README names {path}, the package has not"
    trees = [p for p in documented if p.endswith("/")]
    undocumented = [
        path for path, kind in shipped.items() if kind != "d"
        and not any(fnmatch.fnmatch(path, p) for p in documented)
        and not any(fnmatch.fnmatch(path, f"{tree}*") for tree in trees)]
    assert not undocumented, f"in the package, not in the README's table: {undocumented}"
