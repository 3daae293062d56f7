"""Job payload for the integration tests: report containment as seen from inside a job.

Runs under the system python3 as the job owner (no geco import). Prints one
JSON line with what the kernel says about this process (on cgroup v2 also under
"v2": the effective cpus and memory limits of its cgroup), then optionally
allocates memory (touching every page) and/or sleeps:

    probe.py [--alloc MIB] [--sleep SECONDS]
"""

import json
import os
import sys
import time


def cgroups():
    out = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for c in controllers.split(","):
                out[c or "unified"] = path
    return out


def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def main(argv):
    alloc = int(argv[argv.index("--alloc") + 1]) if "--alloc" in argv else 0
    sleep = float(argv[argv.index("--sleep") + 1]) if "--sleep" in argv else 0.0
    cg = cgroups()
    mem = "/sys/fs/cgroup/memory" + cg.get("memory", "/")
    report = {
        "pid": os.getpid(),
        "cgroups": cg,
        "cpus": sorted(os.sched_getaffinity(0)),
        "memory_limit": read(mem + "/memory.limit_in_bytes"),
        "memsw_limit": read(mem + "/memory.memsw.limit_in_bytes"),
        "env": {k: v for k, v in os.environ.items() if k.startswith("GECO_")},
        "start": time.time(),
    }
    if "memory" not in cg and "unified" in cg:
        # cgroup v2: one hierarchy, the limits in its own file names
        v2 = "/sys/fs/cgroup" + cg["unified"]
        report["v2"] = {name: read(f"{v2}/{name}") for name in
                        ("cpuset.cpus.effective", "memory.max", "memory.swap.max")}
    print(json.dumps(report), flush=True)
    if alloc:
        # bytes * n writes every byte, so the pages are really charged to the cgroup
        hog = b"\x01" * (alloc << 20)
        print(json.dumps({"allocated_mib": len(hog) >> 20}), flush=True)
    if sleep:
        time.sleep(sleep)
    print(json.dumps({"done": time.time()}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
