"""cffi builder for ``geco._lane_cffi``: gecod's fast lane (``preload/geco_lane.c``).

The C sources live in ``preload/`` beside the preload's, whose wire-format code
(``geco_proto.c``) they share: one implementation of the frame for the preload,
the hook program, pam_geco.so and this lane. API (out-of-line) mode, as for
hwloc: the compiler checks the declarations below against ``geco_lane.h``.

Build in place (writes ``geco/_lane_cffi.*.so`` next to this file)::

    /opt/geco/venv/bin/python -m geco._lane_build

``pip install .`` builds it through ``setup.py`` (``cffi_modules``). Needs
libsodium (``libsodium-dev``).
"""

from __future__ import annotations

from pathlib import Path

from cffi import FFI

__all__ = ["ffibuilder"]

MODULE_NAME = "geco._lane_cffi"
PRELOAD = Path(__file__).resolve().parent.parent / "preload"

CDEF = """
#define GECO_KEY_BYTES 32
#define GECO_NONCE_BYTES 16
#define GECO_MAX_FRAME 4164
typedef struct geco_lane geco_lane_t;
typedef struct {
    int fd;
    int pidfd;
    int pid, uid, gid;
    double accepted;
    uint32_t len;
    int recorded;
    int died;
    uint8_t buf[4164];
} geco_handoff_t;
geco_lane_t *geco_lane_new(int listen_fd, int notify_fd, int64_t replay_window_ns,
                           uint32_t replay_capacity);
int geco_lane_configure(geco_lane_t *lane, const uint8_t *key, int64_t max_skew_ns,
                        const char *spool_root, const uint32_t *uids, int nuids,
                        const char *journal, int seed_lines);
int geco_lane_publish(geco_lane_t *lane, uint64_t job, uint64_t task, const char *procs,
                      const char *resources, int64_t res_mtime_ns, uint64_t res_ino,
                      const char *fields);
void geco_lane_withdraw(geco_lane_t *lane, uint64_t job, uint64_t task);
void geco_lane_run(geco_lane_t *lane);
void geco_lane_stop(geco_lane_t *lane);
int geco_lane_take(geco_lane_t *lane, geco_handoff_t *out);
uint64_t geco_lane_served(geco_lane_t *lane);
uint64_t geco_lane_journal_drops(geco_lane_t *lane);
int geco_lane_changed(geco_lane_t *lane);
int geco_lane_replay_check(geco_lane_t *lane, const uint8_t *nonce, int64_t now_ns);
uint32_t geco_lane_replay_size(geco_lane_t *lane);
void geco_lane_free(geco_lane_t *lane);
"""


def _builder(preload: str) -> FFI:
    """The module's builder with its C sources in ``preload`` (setuptools wants a path
    relative to setup.py; the in-place build compiles elsewhere and needs it absolute)."""
    builder = FFI()
    builder.cdef(CDEF)
    builder.set_source(
        MODULE_NAME, '#include "geco_lane.h"\n',
        sources=[f"{preload}/geco_lane.c", f"{preload}/geco_proto.c"],
        include_dirs=[preload], libraries=["sodium"],
        extra_compile_args=["-std=gnu11", "-O2", "-pthread", "-Wall", "-Wextra"],
        extra_link_args=["-pthread"])
    return builder


ffibuilder = _builder("preload")  # setup.py's (cffi_modules), run from the project's root


def main() -> None:
    """Build the extension in place: ``geco/_lane_cffi.*.so`` beside this file."""
    # here, not at the top: setup.py runs this file as a script, with no geco to import
    from geco._cffi_inplace import build_in_place

    print(build_in_place(_builder(str(PRELOAD)), Path(__file__).resolve().parent))


if __name__ == "__main__":
    main()
