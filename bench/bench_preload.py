"""What the exec() preload costs on execs that are not job starts.

Run as root from the repo root:

    /opt/geco-dev/venv/bin/python -m bench.bench_preload [--forks 2000] [--batches 10]

Builds ``preload/`` with make (``make preload``) when needed, compiles a small C driver, and
writes a throw-away config and key (the preload is active, as in sge_execd;
no gecod is needed because /bin/true is not in ``exec_filter``). Then, in
interleaved batches so that machine noise hits every mode alike:

* fork+exec of /bin/true by a driver without the preload;
* the same with the preload in the driver (the exec goes through the wrapper's
  fast path; the child's environment has no LD_PRELOAD);
* the same with the preload also inherited by the child (it then pays the
  library's load and constructor: config, key file, libsodium init -- what
  sge_execd's own non-shepherd children pay);
* ``execve()`` of a missing path in a loop (no fork): the wrapper's own cost
  per call, without the fork/exec noise around it.

A do-nothing interposer (an ``execve`` that only calls the next one) runs as a
reference in the parent modes: the price of any LD_PRELOAD'ed exec wrapper
(one more indirect call, one more library mapped), below which geco cannot go.

Prints medians (µs per fork+exec, ns per failing execve) and the ratios to the
run without any preload.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench._table import Row, add_json_option, write_rows

REPO = Path(__file__).resolve().parent.parent
# the Makefile's default BUILD
LIB = REPO / "build" / "c" / "libgeco_preload.so"
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}

DRIVER = r"""
/* driver forkexec N TARGET INHERIT: N x fork + exec TARGET + wait, one line of ns each.
   INHERIT=0: the child's environment is ours without LD_PRELOAD.
   driver failexec N: N x execve() of a missing path, one line: total ns. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(int argc, char **argv)
{
    long n = atol(argv[2]);
    if (strcmp(argv[1], "failexec") == 0) {
        char *args[] = {"missing", NULL}, *envs[] = {NULL};
        long long t0 = now_ns();
        for (long i = 0; i < n; i++)
            execve("/nonexistent/geco-bench", args, envs);
        printf("%lld\n", now_ns() - t0);
        return 0;
    }
    char *child_env[256];
    int k = 0;
    for (char **e = environ; *e != NULL && k < 255; e++)
        if (atoi(argv[4]) || strncmp(*e, "LD_PRELOAD=", 11) != 0)
            child_env[k++] = *e;
    child_env[k] = NULL;
    char *args[] = {argv[3], NULL};
    for (long i = 0; i < n; i++) {
        long long t0 = now_ns();
        pid_t pid = fork();
        if (pid == 0) {
            execve(argv[3], args, child_env);
            _exit(127);
        }
        int status;
        waitpid(pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            return 1;
        printf("%lld\n", now_ns() - t0);
    }
    return 0;
}
"""


INTERPOSER = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
static int (*next)(const char *, char *const[], char *const[]);
__attribute__((constructor)) static void init(void) { next = dlsym(RTLD_NEXT, "execve"); }
int execve(const char *p, char *const a[], char *const e[]) { return next(p, a, e); }
"""


def _build(work: Path) -> tuple[Path, Path]:
    """Build the preload (make), the driver and the do-nothing interposer."""
    subprocess.run(["make", "-s", "-C", str(REPO), "preload"], check=True, env=ENV)
    (work / "driver.c").write_text(DRIVER)
    (work / "interposer.c").write_text(INTERPOSER)
    # named sge_execd: the preload works only there (by /proc/self/exe), and the wrapper's
    # fast path in execd is what is measured
    driver, interposer = work / "sge_execd", work / "interposer.so"
    subprocess.run(["cc", "-O2", "-Wall", "-o", str(driver), str(work / "driver.c")],
                   check=True, env=ENV)
    subprocess.run(["cc", "-O2", "-Wall", "-shared", "-fPIC", "-o", str(interposer),
                    str(work / "interposer.c"), "-ldl"], check=True, env=ENV)
    return driver, interposer


def _setup(work: Path) -> Path:
    key = work / "quarantine.key"
    key.write_bytes(secrets.token_bytes(32))
    key.chmod(0o600)
    conf = work / "preload.conf"
    conf.write_text(f"socket=path:{work}/gecod.sock\nkey_file={key}\ntimeout_ms=1000\n"
                    f"policy=refuse\nexec_filter=sge_shepherd\n")
    conf.chmod(0o644)
    return conf


def _run(driver: Path, argv: list[str], env: dict[str, str]) -> list[int]:
    out = subprocess.run([str(driver), *argv], capture_output=True, text=True, env=env,
                         check=True).stdout
    return [int(line) for line in out.split()]


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--forks", type=int, default=2000, help="fork+execs per mode")
    parser.add_argument("--batches", type=int, default=10, help="interleaved batches")
    parser.add_argument("--calls", type=int, default=200_000, help="failing execve() calls")
    add_json_option(parser)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_preload: run as root (the preload reads a root-only key)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="geco-bench-preload-") as tmp:
        work = Path(tmp)
        driver, interposer = _build(work)
        conf = _setup(work)
        preloaded = dict(ENV, LD_PRELOAD=str(LIB), GECO_PRELOAD_CONF=str(conf))
        reference = dict(ENV, LD_PRELOAD=str(interposer))
        modes = {
            "without preload": (ENV, "0"),
            "do-nothing interposer in parent": (reference, "0"),
            "geco preload in the parent": (preloaded, "0"),
            "geco preload inherited by child": (preloaded, "1"),
        }
        call_modes = {"without preload": ENV, "do-nothing interposer": reference,
                      "geco preload (fast path)": preloaded}
        per_batch = max(1, args.forks // args.batches)
        per_call_batch = max(1, args.calls // args.batches)
        samples: dict[str, list[int]] = {name: [] for name in modes}
        calls: dict[str, list[float]] = {name: [] for name in call_modes}
        for _ in range(args.batches):
            for name, (env, inherit) in modes.items():
                samples[name] += _run(driver, ["forkexec", str(per_batch), "/bin/true",
                                               inherit], env)
            for name, env in call_modes.items():
                total = _run(driver, ["failexec", str(per_call_batch)], env)[0]
                calls[name].append(total / per_call_batch)

    base = statistics.median(samples["without preload"]) / 1000
    rows = []
    print(f"fork+exec+wait of /bin/true, {per_batch * args.batches} per mode in "
          f"{args.batches} interleaved batches (median µs):")
    for name, values in samples.items():
        median = statistics.median(values) / 1000
        print(f"  {name:32s} {median:8.1f} µs   ratio {median / base:.3f}")
        if name.startswith("geco"):
            rows.append(Row(f"fork+exec of /bin/true, {name}, p50", median, "us", "-", base,
                            "without the preload"))
    base_call = statistics.median(calls["without preload"])
    print(f"execve() of a missing path, {per_call_batch * args.batches} calls per mode "
          f"(median of the batch means, ns per call):")
    for name, means in calls.items():
        median = statistics.median(means)
        print(f"  {name:32s} {median:8.0f} ns   difference {median - base_call:+5.0f} ns, "
              f"ratio {median / base_call:.3f}")
        if name.startswith("geco"):
            rows.append(Row("execve() of a missing path, geco preload (fast path)", median,
                            "ns", "-", base_call, "without the preload"))
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
