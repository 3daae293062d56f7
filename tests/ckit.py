"""Building geco's C (libgeco/, lane/) into a Python module for a test: cffi, with UBSan.

The C tests call the very functions the preload, the lane and the hook program link,
built warning-free and with undefined behaviour fatal, from a temporary directory.
"""

from __future__ import annotations

import importlib.util
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cffi

REPO = Path(__file__).resolve().parents[1]
#: where the C that several programs share lives, and its headers
LIBGECO = REPO / "libgeco"


def ubsan_module(name: str, cdef: str, header: str, sources: Sequence[str], build: Path, *,
                 libraries: Sequence[str] = ()) -> Any:
    """The cffi module ``name`` (``.ffi``, ``.lib``) of ``sources`` (files in libgeco/)
    declared by ``cdef``, with ``header`` included, compiled in ``build``."""
    ffi = cffi.FFI()
    ffi.cdef(cdef)
    ffi.set_source(name, f'#include "{header}"', sources=[str(LIBGECO / s) for s in sources],
                   include_dirs=[str(LIBGECO)], libraries=list(libraries),
                   extra_compile_args=["-std=gnu11", "-Wall", "-Werror", "-fsanitize=undefined",
                                       "-fno-sanitize-recover=all"],
                   extra_link_args=["-fsanitize=undefined"])
    so = ffi.compile(tmpdir=str(build))
    spec = importlib.util.spec_from_file_location(name, so)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def undefined_calls(source: Path, flags: Sequence[str], build: Path) -> dict[str, set[str]]:
    """Per optimisation level (-O0, -O2): the names ``source``'s object calls but does not
    define (``nm -u``), built with ``flags``."""
    calls = {}
    for opt in ("-O0", "-O2"):
        obj = build / f"{source.stem}{opt}.o"
        subprocess.run(["gcc", *flags, opt, "-c", str(source), "-o", str(obj)], check=True,
                       capture_output=True, text=True)
        nm = subprocess.run(["nm", "-u", str(obj)], check=True, capture_output=True,
                            text=True).stdout
        calls[opt] = {line.split()[-1] for line in nm.splitlines() if line.strip()}
    return calls
