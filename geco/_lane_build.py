"""cffi builder for ``geco._lane_cffi``: gecod's fast lane (``lane/*.c``, one job a file,
``lane/lane.h`` names them; ``lane/geco_lane.h`` is its interface).

The lane shares libgeco's wire format (``libgeco/geco_proto.c``) and job identity
(``libgeco/geco_job.c``) with the preload, the hook program and pam_geco.so: one
implementation of the frame and of a job's ids for all of them. API (out-of-line)
mode, as for hwloc: the compiler checks the declarations below against ``geco_lane.h``.

Build in place (writes ``geco/_lane_cffi.*.so`` next to this file)::

    /opt/geco-dev/venv/bin/python -m geco._lane_build

``pip install .`` builds it through ``setup.py`` (``cffi_modules``). Needs
libsodium (``libsodium-dev``).
"""

from __future__ import annotations

import re
from pathlib import Path

from cffi import FFI

__all__ = ["ffibuilder"]

MODULE_NAME = "geco._lane_cffi"
REPO = Path(__file__).resolve().parent.parent
#: the lane's C files (lane/lane.h says what each does)
LANE_SOURCES = ("geco_lane.c", "serve.c", "jobs.c", "handoff.c", "journal.c", "replay.c")



def _cdef() -> str:
    """The declarations ``geco_lane.h`` marks for Python, its constants spelled out from
    ``geco_proto.h`` (cffi's parser expands no macros): one text, in the header."""
    header = (REPO / "lane" / "geco_lane.h").read_text()
    text = header.split("/* cffi: from here", 1)[1].split("*/", 1)[1]
    text = text.split("/* cffi: to here */", 1)[0]
    constants = dict(re.findall(r"^#define (GECO_\w+) (.+)$",
                                (REPO / "libgeco" / "geco_proto.h").read_text(), re.MULTILINE))
    while (name := next((n for n in constants if re.search(rf"\b{n}\b", text)), None)):
        text = re.sub(rf"\b{name}\b", f"({constants[name]})", text)
    return text



def _builder(root: Path) -> FFI:
    """The module's builder with its C sources under ``root``, the project's root
    (setuptools wants paths relative to setup.py; the in-place build compiles elsewhere
    and needs them absolute)."""
    builder = FFI()
    builder.cdef(_cdef())
    builder.set_source(
        MODULE_NAME, '#include "geco_lane.h"\n',
        sources=[*(str(root / "lane" / c) for c in LANE_SOURCES),
                 str(root / "libgeco" / "geco_proto.c"), str(root / "libgeco" / "geco_job.c")],
        include_dirs=[str(root / "lane"), str(root / "libgeco")], libraries=["sodium"],
        extra_compile_args=["-std=gnu11", "-O2", "-pthread", "-Wall", "-Wextra"],
        extra_link_args=["-pthread"])
    return builder


ffibuilder = _builder(Path())  # setup.py's (cffi_modules), run from the project's root


def main() -> None:
    """Build the extension in place: ``geco/_lane_cffi.*.so`` beside this file."""
    # here, not at the top: setup.py runs this file as a script, with no geco to import
    from geco._cffi_inplace import build_in_place

    print(build_in_place(_builder(REPO), Path(__file__).resolve().parent))


if __name__ == "__main__":
    main()
