"""Time from the kernel's OOM kill to geco's OomEvent and to its journal entry, on cgroup v1.

Run as root from the repo root:

    /opt/geco-dev/venv/bin/python -m bench.bench_oom [--runs N] [--journal-kills M]

A child in a 64 MiB job cgroup touches 200 MiB and is OOM-killed; a thread
blocked in ``waitpid`` notes when the kernel has reaped it, and an
:class:`geco.oom.OomMonitor` in a :class:`geco.daemon.runloop.RunLoop` notes
when its event callback runs. Printed: callback time minus waitpid time
(negative = the event was out before ``waitpid`` returned), median of
``--runs`` kills, with min and max; once with ``/dev/kmsg`` (the monitor's
normal set-up, victims named) and once without (only the eventfd and the
re-check timers). Also: how often the v1 eventfd fires before the kill is
counted, seen by a bare :class:`geco.oom.OomWatch` read at once on wake-up.

Then the whole path, kernel to journal: ``--journal-kills`` kills with the same
monitor (``/dev/kmsg`` on, journal on, reports handled in the loop as the
tests do; gecod hands them to a worker), each compared with

* the kernel's time of the kill: the timestamp of its ``oom-kill:`` line in
  ``/dev/kmsg``, read by a reader of our own and matched by pid. Those stamps
  are the kernel's ``local_clock()`` (printk), not ``CLOCK_MONOTONIC``: the
  offset between the two is measured with marker lines written to
  ``/dev/kmsg`` between two ``CLOCK_MONOTONIC`` reads, before and after (ten
  ``geco bench_oom: clock check`` lines in dmesg), and the kill times are
  corrected by it;
* the ``GECO_EVENT=oom`` entry gecod's code journaled for that pid:
  ``__MONOTONIC_TIMESTAMP`` (``CLOCK_MONOTONIC`` when journald's event loop
  woke up to process it: ``sd_event_now``), and the time geco's datagram
  reached journald's socket (``_SOURCE_REALTIME_TIMESTAMP``, the kernel's
  ``SO_TIMESTAMP``, moved onto ``CLOCK_MONOTONIC`` by the entry's own
  realtime/monotonic pair), which splits geco's part from journald's.

The kernel logs at most 10 ``oom-kill:`` lines per 5 s (``oom_rs`` in
mm/oom_kill.c), so those kills start 5 s after the earlier ones and are paced
``--pace`` s apart; a kill whose line is missing anyway (another OOM on the
node took the budget) is counted and left out. journald is used as it runs, or
started for the run and stopped afterwards (as the test fixtures do).

Cgroups are made under ``geco-test-bench-<pid>`` and removed afterwards, also
on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from bench._common import journald, percentile, run_in_cgroups, sigterm_exits, v1_backend
from bench._table import Row, add_json_option, write_rows
from geco import log, oom
from geco.cgroup import Limits, V1Backend
from geco.daemon.runloop import RunLoop

MiB = 1 << 20
KEY = "1.1"
# the journal figure's job: its own cgroup (the first one has old kills) and a job
# id of its own in the journal (bench_gecod uses 77001)
JOURNAL_KEY = "77003.1"
LIMITS = Limits(memory=64 * MiB, memory_swap=64 * MiB)
# the kernel's oom-kill line budget: DEFAULT_RATELIMIT_INTERVAL and _BURST
RATE_WINDOW, RATE_BURST = 5.0, 10
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


def start_victim(backend: V1Backend, key: str = KEY) -> tuple[int, int]:
    """Fork a child that waits, then touches 200 MiB; return (pid, fd that releases it)."""
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(go_w)
        os.read(go_r, 1)
        block = bytearray(200 * MiB)
        os._exit(len(block) & 0)
    os.close(go_r)
    backend.add_pid(key, pid)
    return pid, go_w


def waitpid_stamp(pid: int, out: list[float]) -> threading.Thread:
    def run() -> None:
        os.waitpid(pid, 0)
        out.append(time.monotonic())
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def kill_one(loop: RunLoop, backend: V1Backend, key: str, stamps: list[float]) -> tuple[int, float]:
    """OOM-kill one victim in job ``key``; run the loop until the monitor's callback stamps it.

    Returns
    -------
    The victim's pid and the time (CLOCK_MONOTONIC s) ``waitpid`` returned for it.
    """
    before = len(stamps)
    waited: list[float] = []
    pid, go = start_victim(backend, key)
    thread = waitpid_stamp(pid, waited)
    os.write(go, b"x")
    os.close(go)
    deadline = time.monotonic() + 10
    while len(stamps) == before and time.monotonic() < deadline:
        loop.run_once()
    thread.join(10)
    if len(stamps) == before or not waited:
        raise SystemExit("bench_oom: no OOM event within 10 s")
    return pid, waited[0]


def monitor_runs(backend: V1Backend, runs: int, kmsg: bool) -> list[float]:
    """Milliseconds from waitpid to the monitor's callback, per kill."""
    stamps: list[float] = []
    deltas = []
    with tempfile.TemporaryDirectory(prefix="geco-bench-oom-") as state, \
            RunLoop(granularity=1.0) as loop:
        monitor = oom.OomMonitor(loop, backend, state_dir=Path(state),
                                 kmsg=oom.KMSG if kmsg else None, sweep_interval=3600,
                                 on_events=lambda events: stamps.append(time.monotonic()))
        monitor.start()
        try:
            for _ in range(runs):
                _, waited = kill_one(loop, backend, KEY, stamps)
                deltas.append((stamps[-1] - waited) * 1e3)
        finally:
            monitor.close()
    return deltas


def early_wakeups(backend: V1Backend, runs: int) -> int:
    """How many eventfd wake-ups found the kill not yet counted."""
    early = 0
    with tempfile.TemporaryDirectory(prefix="geco-bench-oom-") as state, \
            oom.OomWatch(backend, KEY, state_dir=Path(state)) as watch:
        watch.check()
        for _ in range(runs):
            pid, go = start_victim(backend)
            os.write(go, b"x")
            os.close(go)
            select.select([watch], [], [], 10)
            if not watch.on_readable():
                early += 1
            os.waitpid(pid, 0)
            watch.check()
    return early


# -- kernel OOM kill -> journal entry ---------------------------------------------


@dataclass(frozen=True, slots=True)
class ClockOffset:
    """How far ``/dev/kmsg`` time stamps are ahead of CLOCK_MONOTONIC, in µs."""

    offset: float
    error: float  # half the time the marker write took: the offset's uncertainty


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """The times of one journal entry, in CLOCK_MONOTONIC µs."""

    written: int    # __MONOTONIC_TIMESTAMP: journald's loop took the datagram
    received: int   # _SOURCE_REALTIME_TIMESTAMP on the monotonic clock: it reached the socket


def open_kmsg_reader() -> int:
    """A non-blocking reader of the kernel log, positioned after what it holds now."""
    fd = os.open(oom.KMSG, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    os.lseek(fd, 0, os.SEEK_END)
    return fd


def read_kmsg(reader: int) -> list[tuple[int, bytes]]:
    """Every record logged since the last read: (time stamp µs, message)."""
    records: list[tuple[int, bytes]] = []
    while True:
        try:
            record = os.read(reader, 16384)
        except BlockingIOError:
            return records
        except BrokenPipeError:  # records overwritten before we read them: go on after them
            continue
        header, _, rest = record.partition(b";")
        fields = header.split(b",")
        if len(fields) >= 3 and fields[2].isdigit():
            records.append((int(fields[2]), rest.split(b"\n", 1)[0]))


def kmsg_clock_offset(reader: int, tries: int = 5) -> ClockOffset:
    """Write marker lines to ``/dev/kmsg`` between two CLOCK_MONOTONIC reads; best bracket wins."""
    best: ClockOffset | None = None
    writer = os.open(oom.KMSG, os.O_WRONLY | os.O_CLOEXEC)
    try:
        for _ in range(tries):
            read_kmsg(reader)
            token = f"geco bench_oom: clock check {uuid.uuid4().hex}".encode()
            before = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            os.write(writer, token + b"\n")
            after = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            stamps = [usec for usec, message in read_kmsg(reader) if message.endswith(token)]
            if stamps:
                found = ClockOffset(stamps[0] - (before + after) / 2e3, (after - before) / 2e3)
                if best is None or found.error < best.error:
                    best = found
    finally:
        os.close(writer)
    if best is None:
        raise SystemExit("bench_oom: the marker lines written to /dev/kmsg did not come back")
    return best


def journal_entries(*match: str) -> list[dict[str, str]]:
    """This process's journal entries that match every ``FIELD=value``, after a sync."""
    subprocess.run(["journalctl", "--sync"], env=ENV, check=False, capture_output=True,
                   timeout=30)
    out = subprocess.run(["journalctl", "-o", "json", "--no-pager", f"_PID={os.getpid()}",
                          *match], env=ENV, check=False, capture_output=True, text=True,
                         timeout=30).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def entry_times(entry: dict[str, str]) -> JournalEntry:
    written = int(entry["__MONOTONIC_TIMESTAMP"])
    # the datagram's arrival on the realtime clock, moved onto the monotonic one by
    # the entry's own pair of stamps (both sd_event_now of the same loop iteration)
    arrived = int(entry.get("_SOURCE_REALTIME_TIMESTAMP", entry["__REALTIME_TIMESTAMP"]))
    return JournalEntry(written, written + arrived - int(entry["__REALTIME_TIMESTAMP"]))


def journal_clock_delay() -> float:
    """Milliseconds from sending a plain entry to its __MONOTONIC_TIMESTAMP (clock check)."""
    token = uuid.uuid4().hex
    sent = time.clock_gettime_ns(time.CLOCK_MONOTONIC) / 1e3
    log.get("bench").info("clock check", extra=log.job_fields(
        None, None, "bench-clock-check", MARK=token))
    deadline = time.monotonic() + 10
    while not (found := journal_entries("GECO_EVENT=bench-clock-check", f"MARK={token}")):
        if time.monotonic() > deadline:
            raise SystemExit("bench_oom: journald did not store an entry within 10 s")
        time.sleep(0.1)
    return (entry_times(found[0]).written - sent) / 1e3


@dataclass(frozen=True, slots=True)
class JournalFigures:
    """Per kill (ms): kernel -> OomEvent, -> datagram in journald's socket, -> entry stamped."""

    event: list[float]
    received: list[float]
    written: list[float]
    no_kernel_line: int
    no_entry: int
    offsets: tuple[ClockOffset, ClockOffset]
    plain_entry: float


def journal_runs(backend: V1Backend, kills: int, pace: float) -> JournalFigures:
    """OOM-kill ``kills`` victims under a journaling monitor; time kernel kill -> journal entry."""
    backend.create(JOURNAL_KEY, LIMITS)
    stamps: list[float] = []
    victims: list[tuple[int, float]] = []  # pid, OomEvent callback (CLOCK_MONOTONIC s)
    kernel: dict[int, int] = {}
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")
    with journald(), tempfile.TemporaryDirectory(prefix="geco-bench-oom-") as state, \
            RunLoop(granularity=1.0) as loop:
        log.setup("quiet", identifier="geco-bench-oom", journal=True)
        reader = open_kmsg_reader()
        try:
            plain_entry = journal_clock_delay()
            first = kmsg_clock_offset(reader)
            monitor = oom.OomMonitor(loop, backend, state_dir=Path(state), kmsg=oom.KMSG,
                                     sweep_interval=3600,
                                     on_events=lambda events: stamps.append(time.monotonic()))
            monitor.start()
            try:
                # the earlier kills spent the kernel's budget of oom-kill lines
                time.sleep(RATE_WINDOW)
                for _ in range(kills):
                    started = time.monotonic()
                    pid, _ = kill_one(loop, backend, JOURNAL_KEY, stamps)
                    victims.append((pid, stamps[-1]))
                    time.sleep(max(0.0, started + pace - time.monotonic()))
            finally:
                monitor.close()
            for usec, message in read_kmsg(reader):
                record = oom.parse_oom_kill(message)
                if record is not None:
                    kernel[record.pid] = usec
            last = kmsg_clock_offset(reader)
        finally:
            os.close(reader)
            log.setup("quiet", journal=False)
        entries: dict[int, JournalEntry] = {}
        deadline = time.monotonic() + 10
        while len(entries) < len(victims) and time.monotonic() < deadline:
            for entry in journal_entries("GECO_EVENT=oom", f"JOB_ID={JOURNAL_KEY.split('.')[0]}"):
                if entry.get("PID", "").isdigit() and entry.get("_BOOT_ID") == boot_id:
                    entries[int(entry["PID"])] = entry_times(entry)
            time.sleep(0.1)
    offset = (first.offset + last.offset) / 2
    event, received, written = [], [], []
    for pid, callback in victims:
        if pid in kernel and pid in entries:
            killed = kernel[pid] - offset
            event.append((callback * 1e6 - killed) / 1e3)
            received.append((entries[pid].received - killed) / 1e3)
            written.append((entries[pid].written - killed) / 1e3)
    pids = [pid for pid, _ in victims]
    return JournalFigures(event, received, written, sum(p not in kernel for p in pids),
                          sum(p in kernel and p not in entries for p in pids),
                          (first, last), plain_entry)


def print_journal_figures(fig: JournalFigures, kills: int, pace: float) -> None:
    first, last = fig.offsets
    print(f"OOM kill -> journal entry (GECO_EVENT=oom), {kills} kills {pace:g} s apart "
          f"(the kernel logs <= {RATE_BURST} oom-kill lines per {RATE_WINDOW:g} s)")
    print("  clocks: /dev/kmsg stamps are the kernel's local_clock(), not CLOCK_MONOTONIC;")
    print(f"    here they run {first.offset / 1e3:+.3f} ms (before) / {last.offset / 1e3:+.3f} ms"
          f" (after) from CLOCK_MONOTONIC (+-{max(first.error, last.error) / 1e3:.3f} ms),")
    print("    measured with marker lines; the kill times below are corrected by the mean.")
    print("    journal __MONOTONIC_TIMESTAMP is CLOCK_MONOTONIC when journald's loop took the")
    print(f"    entry (sd_event_now); a plain entry here: stamped {fig.plain_entry:.2f} ms after"
          " it was sent.")
    if not fig.written:
        print("  no kill had both its oom-kill line and its journal entry: no figure")
    else:
        for label, values in (("kernel kill -> OomEvent callback", fig.event),
                              ("kernel kill -> geco's entry in the socket", fig.received),
                              ("kernel kill -> journal entry (__MONOTONIC)", fig.written)):
            print(f"  {label:<42} median {statistics.median(values):7.2f} ms   p90 "
                  f"{percentile(values, 0.9):7.2f}   max {max(values):7.2f}   "
                  f"(n={len(values)})")
            _ROWS.append(Row(f"OOM relay: {label}, p50", statistics.median(values), "ms"))
    if fig.no_kernel_line or fig.no_entry:
        print(f"  left out: {fig.no_kernel_line} kill(s) without an oom-kill line (rate limit: "
              f"another OOM on this node?), {fig.no_entry} without a journal entry")


_ROWS: list[Row] = []


def row(label: str, values: list[float]) -> None:
    print(f"  {label:<34} median {statistics.median(values):7.2f} ms   "
          f"min {min(values):7.2f}   max {max(values):7.2f}   (n={len(values)})")


def measure(backend: V1Backend, args: argparse.Namespace) -> None:
    """Every figure, printed as it comes."""
    backend.create(KEY, LIMITS)
    print(f"OOM kill -> OomEvent on Linux {os.uname().release}, cgroup v1, 64 MiB job, "
          f"{os.cpu_count()} cpus, Python {sys.version.split()[0]}")
    print("  (callback time - waitpid return; negative = event before waitpid)")
    row("monitor with /dev/kmsg", monitor_runs(backend, args.runs, kmsg=True))
    row("monitor without /dev/kmsg", monitor_runs(backend, args.runs, kmsg=False))
    early = early_wakeups(backend, args.runs)
    print(f"  v1 eventfd wake-ups before the kill was counted: {early} of {args.runs}")
    if args.journal_kills > 0:
        # a job of its own: a new monitor would report the first job's old kills
        backend.destroy(KEY)
        print_journal_figures(journal_runs(backend, args.journal_kills, args.pace),
                              args.journal_kills, args.pace)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="kills per measurement")
    parser.add_argument("--journal-kills", type=int, default=10,
                        help="kills timed from the kernel to the journal (0 = skip)")
    parser.add_argument("--pace", type=float, default=RATE_WINDOW / RATE_BURST + 0.05,
                        help="seconds between those kills (the kernel's log rate limit)")
    add_json_option(parser)
    args = parser.parse_args()
    # the monitor's journal records would only add noise (and journald load) here
    log.setup("quiet", journal=False)
    if os.geteuid() != 0:
        print("bench_oom: run as root (it makes memory cgroups)", file=sys.stderr)
        return 1
    sigterm_exits()
    backend = v1_backend(f"geco-test-bench-{os.getpid()}", V1Backend)
    code = run_in_cgroups("bench_oom", backend, lambda: measure(backend, args))
    write_rows(args.json, _ROWS)
    return code


if __name__ == "__main__":
    sys.exit(main())
