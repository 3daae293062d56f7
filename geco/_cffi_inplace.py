"""Build a cffi extension of geco in place, beside its builder (tests import the checkout).

``pip install .`` builds the extensions through ``setup.py`` (``cffi_modules``);
``scripts/install.sh`` also runs each ``geco/_*_build.py`` as a module, which
calls :func:`build_in_place`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from cffi import FFI

__all__ = ["build_in_place"]


def build_in_place(ffibuilder: FFI, package_dir: Path) -> Path:
    """Compile ``ffibuilder``'s module and put the result in ``package_dir``; return it."""
    # cffi compiles inside (and chdirs into) tmpdir; a scratch directory keeps the
    # generated .c/.o out of the tree and setuptools from reading our pyproject.toml
    with tempfile.TemporaryDirectory(prefix="geco-cffi-build-") as tmp:
        built = Path(ffibuilder.compile(tmpdir=tmp, verbose=False))
        target = package_dir / built.name
        # copy beside the target, then rename over it: running processes (a gecod, a
        # test session) have the old file mapped, and rewriting it in place would
        # crash them (SIGSEGV); a rename leaves their inode alone
        staged = package_dir / f".{built.name}.new"
        shutil.copyfile(built, staged)
        os.replace(staged, target)
    return target
