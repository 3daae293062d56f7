"""cffi builder for ``geco._hwloc_cffi``: the C bridge between hwloc and :mod:`geco.node.topology`.

Why cffi in API (out-of-line) mode, with a C helper that flattens the topology:

* hwloc's object struct (``struct hwloc_obj``) changes between releases. ABI
  mode (``ffi.dlopen``) would have to copy its layout into a cdef and silently
  read garbage when libhwloc is upgraded under us. In API mode the C compiler
  reads ``<hwloc.h>``, and Python only ever sees the four ``int`` arrays this
  helper fills (per PU: OS index, core logical index, NUMA node OS index,
  package logical index). No hwloc struct crosses into Python.
* It runs in-process: loading a topology costs a fraction of a millisecond
  (see ``bench/bench_cores.py``), where forking ``lstopo --of xml`` and
  parsing its output costs a process start plus the XML. The prolog runs once
  per job and gecod reloads on demand, so both paths matter.
* The same code loads this host or an hwloc *synthetic* description
  (``pack:2 numa:2 core:16 pu:2``), so tests cover big nodes on a 2-core box.

Build in place (writes ``geco/_hwloc_cffi.*.so`` next to this file)::

    /opt/geco-dev/venv/bin/python -m geco._hwloc_build

``pip install .`` builds it through ``setup.py`` (``cffi_modules``). hwloc is
found with ``pkg-config --cflags --libs hwloc``; without pkg-config the build
falls back to ``-lhwloc`` and the default include path.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from cffi import FFI

__all__ = ["ffibuilder"]

MODULE_NAME = "geco._hwloc_cffi"

CDEF = """
struct geco_topo {
    int npus;
    int *pu_os;      /* per PU, in hwloc logical order: OS index (the kernel's CPU number) */
    int *core;       /* logical index of its core, -1 when hwloc shows no core above it   */
    int *numa;       /* OS index of its nearest NUMA node, -1 when there is none          */
    int *package;    /* logical index of its package, -1 when there is none               */
    int err;         /* 0, or the errno of the failed step                                */
    char msg[256];   /* which step failed, in words                                       */
};

int geco_topo_load(const char *synthetic, const char *restrict_cpus, struct geco_topo *out);
void geco_topo_release(struct geco_topo *out);
unsigned geco_hwloc_build_api(void);
unsigned geco_hwloc_runtime_api(void);
"""

C_SOURCE = r"""
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <hwloc.h>

#if HWLOC_API_VERSION < 0x00020000
#error "geco needs hwloc >= 2.0 (NUMA nodes as memory children, type filters)"
#endif

struct geco_topo {
    int npus;
    int *pu_os;
    int *core;
    int *numa;
    int *package;
    int err;
    char msg[256];
};

unsigned geco_hwloc_build_api(void) { return HWLOC_API_VERSION; }
unsigned geco_hwloc_runtime_api(void) { return hwloc_get_api_version(); }

static int fail(struct geco_topo *out, int err, const char *what)
{
    out->err = err ? err : EINVAL;
    snprintf(out->msg, sizeof out->msg, "%s", what);
    return out->err;
}

/* The NUMA node a PU allocates from by default: the one attached closest to it,
 * i.e. with the smallest cpuset containing it. Memory-only nodes with the same
 * locality (HBM, NVDIMM next to DRAM) tie on weight; the lowest OS index wins,
 * which is the DRAM node on the platforms hwloc documents. */
static int nearest_numa(hwloc_topology_t topo, unsigned pu_os)
{
    hwloc_obj_t node = NULL;
    int best = -1, best_weight = -1;
    while ((node = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, node)) != NULL) {
        if (!node->cpuset || !hwloc_bitmap_isset(node->cpuset, pu_os))
            continue;
        int weight = hwloc_bitmap_weight(node->cpuset);
        if (best < 0 || weight < best_weight
            || (weight == best_weight && (int)node->os_index < best)) {
            best = (int)node->os_index;
            best_weight = weight;
        }
    }
    return best;
}

void geco_topo_release(struct geco_topo *out)
{
    free(out->pu_os);  /* one block holds all four arrays */
    out->pu_os = out->core = out->numa = out->package = NULL;
    out->npus = 0;
}

int geco_topo_load(const char *synthetic, const char *restrict_cpus, struct geco_topo *out)
{
    hwloc_topology_t topo = NULL;
    hwloc_bitmap_t set = NULL;
    int rc = 0;

    memset(out, 0, sizeof *out);
    if (hwloc_topology_init(&topo) < 0) {
        topo = NULL;
        rc = fail(out, errno, "hwloc_topology_init failed");
        goto cleanup;
    }
    /* The caller may sit in a job's cpuset (the prolog runs inside the job's
     * cgroup): hwloc would then drop every PU outside it. geco allocates for the
     * whole node, so it wants every PU; what it may use comes from its own
     * cgroup's cpuset.cpus, passed to the allocator separately. */
    hwloc_topology_set_flags(topo, HWLOC_TOPOLOGY_FLAG_INCLUDE_DISALLOWED);
    /* Caches and I/O are not used for placement; skipping them makes loading cheaper. */
    hwloc_topology_set_cache_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_NONE);
    hwloc_topology_set_icache_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_NONE);
    hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_NONE);
    hwloc_topology_set_type_filter(topo, HWLOC_OBJ_MISC, HWLOC_TYPE_FILTER_KEEP_NONE);

    if (synthetic && hwloc_topology_set_synthetic(topo, synthetic) < 0) {
        rc = fail(out, errno, "invalid synthetic description");
        goto cleanup;
    }
    if (hwloc_topology_load(topo) < 0) {
        rc = fail(out, errno, "hwloc_topology_load failed");
        goto cleanup;
    }
    if (restrict_cpus) {
        set = hwloc_bitmap_alloc();
        if (!set) {
            rc = fail(out, ENOMEM, "hwloc_bitmap_alloc failed");
            goto cleanup;
        }
        if (hwloc_bitmap_list_sscanf(set, restrict_cpus) < 0) {
            rc = fail(out, EINVAL, "invalid cpu list to restrict to");
            goto cleanup;
        }
        if (hwloc_topology_restrict(topo, set, 0) < 0) {
            rc = fail(out, errno, "restricting to the cpu list left no PU");
            goto cleanup;
        }
    }

    int n = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
    if (n <= 0) {
        rc = fail(out, ENODEV, "the topology has no PU");
        goto cleanup;
    }
    int *block = calloc((size_t)n * 4, sizeof(int));
    if (!block) {
        rc = fail(out, ENOMEM, "out of memory for the PU arrays");
        goto cleanup;
    }
    out->pu_os = block;
    out->core = block + n;
    out->numa = block + 2 * n;
    out->package = block + 3 * n;
    out->npus = n;

    for (int i = 0; i < n; i++) {
        hwloc_obj_t pu = hwloc_get_obj_by_type(topo, HWLOC_OBJ_PU, (unsigned)i);
        hwloc_obj_t core = hwloc_get_ancestor_obj_by_type(topo, HWLOC_OBJ_CORE, pu);
        hwloc_obj_t pkg = hwloc_get_ancestor_obj_by_type(topo, HWLOC_OBJ_PACKAGE, pu);
        out->pu_os[i] = (int)pu->os_index;
        out->core[i] = core ? (int)core->logical_index : -1;
        out->numa[i] = nearest_numa(topo, pu->os_index);
        out->package[i] = pkg ? (int)pkg->logical_index : -1;
    }

cleanup:
    if (set)
        hwloc_bitmap_free(set);
    if (topo)
        hwloc_topology_destroy(topo);
    return rc;
}
"""


def _hwloc_flags() -> dict[str, list[str]]:
    """Compiler/linker settings for hwloc: pkg-config's answer, else plain ``-lhwloc``."""
    try:
        out = subprocess.run(
            ["pkg-config", "--cflags", "--libs", "hwloc"],
            check=True, capture_output=True, text=True, timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {"libraries": ["hwloc"]}
    settings: dict[str, list[str]] = {
        "include_dirs": [], "library_dirs": [], "libraries": [],
        "extra_compile_args": [], "extra_link_args": [],
    }
    for token in shlex.split(out):
        if token.startswith("-I"):
            settings["include_dirs"].append(token[2:])
        elif token.startswith("-L"):
            settings["library_dirs"].append(token[2:])
        elif token.startswith("-l"):
            settings["libraries"].append(token[2:])
        else:
            settings["extra_compile_args"].append(token)
    if "hwloc" not in settings["libraries"]:
        settings["libraries"].append("hwloc")
    return settings


ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(MODULE_NAME, C_SOURCE, **_hwloc_flags())


def main() -> None:
    """Build the extension in place: ``geco/_hwloc_cffi.*.so`` beside this file."""
    # here, not at the top: setup.py runs this file as a script, with no geco to import
    from geco._cffi_inplace import build_in_place

    print(build_in_place(ffibuilder, Path(__file__).resolve().parent))


if __name__ == "__main__":
    main()
