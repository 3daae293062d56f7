"""Measure JOB_STARTED while a local user floods gecod's public socket.

Run as root from the repo root:

    /opt/geco-dev/venv/bin/python -m bench.bench_flood [--requests 200] [--hold 2000] [--json PATH]

Starts a throw-away gecod with one spooled job (``bench_gecod.bench_gecod``).
Then, as root on gecod's privileged socket (where the preload asks), client
processes send JOB_STARTED for their own pid and time connect-to-verified-ACK:
once on a quiet gecod, once while uid 65534 holds ``--hold`` connections to the
public socket and four of its threads send STATUS back to back
(``tests/flood.py``). The floor, measured in the same run: a bare Unix socket
round trip (connect, 64 bytes each way, close) to a process that only echoes.

Prints one table; with ``$GECO_FIGURES_DIR`` set, also writes the figures to
``$GECO_FIGURES_DIR/flood.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import multiprocessing.queues
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench._common import percentile
from bench._table import Row, add_json_option, write_rows
from bench.bench_gecod import JOB, TASK, bench_gecod
from geco.wire.frame import decode_ack, encode
from geco.wire.messages import AckStatus, JobStarted, MsgType
from geco.wire.reader import read_frame
from tests.flood import flooding

CLIENTS = 20


def _client(key: bytes, sock_path: str, job_dir: str, requests: int, start: float,
            out: multiprocessing.queues.Queue[list[float] | str]) -> None:
    """One client process: JOB_STARTED for itself, ``requests`` times; report latencies."""
    os.chdir(job_dir)
    while time.time() < start:  # all clients begin together
        time.sleep(0.001)
    times: list[float] = []
    try:
        for _ in range(requests):
            t0 = time.perf_counter()
            frame = encode(MsgType.JOB_STARTED,
                           JobStarted(JOB, TASK, os.getpid()), key)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(sock_path)
                s.sendall(frame)
                reply = read_frame(s, time.monotonic() + 30)
            ack = decode_ack(reply, key, frame[12:28])
            times.append(time.perf_counter() - t0)
            if ack.status is not AckStatus.OK:
                out.put(f"ACK {ack.status.name}")
                return
        out.put(times)
    except Exception as exc:
        out.put(f"{type(exc).__name__}: {exc}")


def _round_trips(key: bytes, sock_path: str, job_dir: Path, clients: int,
                 requests: int) -> tuple[list[float], float]:
    """``clients`` processes (Python, geco.wire) in the job's PE task dir, each sending
    ``requests`` JOB_STARTED for its own pid; their latencies (s) and the wall time."""
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.queues.Queue[list[float] | str] = ctx.Queue()
    start = time.time() + 0.5 + clients * 0.01
    procs = [ctx.Process(target=_client, args=(key, sock_path, str(job_dir), requests, start,
                                                out)) for _ in range(clients)]
    for p in procs:
        p.start()
    results = [out.get(timeout=300) for _ in procs]
    wall = time.time() - start
    for p in procs:
        p.join()
    errors = [r for r in results if isinstance(r, str)]
    if errors:
        raise SystemExit(f"bench_flood: {len(errors)} client(s) failed: {errors[0]}")
    return [t for r in results if isinstance(r, list) for t in r], wall


def round_trip_figures(times: list[float], wall: float) -> str:
    """p50, p99 and rate of a round of requests, as the table shows them."""
    ms = [t * 1e3 for t in times]
    return (f"p50 {statistics.median(ms):.2f} ms, p99 {percentile(ms, 0.99):.2f} ms, "
            f"{len(ms) / wall:.0f} req/s ({len(ms)} requests)")


def _echo(path: str) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen(128)
        while True:
            conn, _ = listener.accept()
            with conn:
                conn.sendall(conn.recv(64))


def socket_floor(requests: int) -> list[float]:
    """Round trips to a bare echo process: what any Unix socket request costs here."""
    path = tempfile.mktemp(prefix="geco-test-bench-echo-", suffix=".sock")
    proc = multiprocessing.get_context("fork").Process(target=_echo, args=(path,), daemon=True)
    proc.start()
    try:
        while not os.path.exists(path):
            time.sleep(0.01)
        times = []
        for _ in range(requests):
            t0 = time.perf_counter()
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(path)
                s.sendall(b"x" * 64)
                s.recv(64)
            times.append(time.perf_counter() - t0)
        return times
    finally:
        proc.kill()
        proc.join()
        os.unlink(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200,
                        help="JOB_STARTED requests per client process")
    parser.add_argument("--hold", type=int, default=2000,
                        help="connections the flooding user holds")
    add_json_option(parser)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_flood: run as root (gecod creates cgroups)", file=sys.stderr)
        return 2
    figures: dict[str, object] = {}
    rows: list[tuple[str, str]] = []
    floor = socket_floor(args.requests)
    rows.append(("floor: bare Unix socket round trip", round_trip_figures(floor, sum(floor))))
    figures["floor_p99_ms"] = round(percentile(floor, 0.99) * 1e3, 3)
    table: list[Row] = []
    with bench_gecod() as g:
        key = g.key_file.read_bytes()
        _round_trips(key, g.root_socket, g.job_dir, 1, 1)  # builds the job's cgroups
        for label, flood in (("quiet", False), ("flooded", True)):
            hold, status = (args.hold, 4) if flood else (0, 0)
            with flooding(g.public_socket, hold=hold, status=status) as attack:
                if flood:
                    time.sleep(2)  # at full strength before the first request
                for clients in (1, CLIENTS):
                    times, wall = _round_trips(key, g.root_socket, g.job_dir, clients,
                                               args.requests // clients or 1)
                    rows.append((f"JOB_STARTED, {clients} client(s), {label}",
                                 round_trip_figures(times, wall)))
                    figures[f"job_started_{label}_{clients}_p99_ms"] = round(
                        percentile(times, 0.99) * 1e3, 3)
                    p, name = (0.5, "p50") if clients == 1 else (0.99, "p99")
                    table.append(Row(f"JOB_STARTED (Python client), {clients} client(s), "
                                     f"{'public socket flooded' if flood else 'quiet'}, {name}",
                                     percentile(times, p) * 1e3, "ms", "-",
                                     percentile(floor, p) * 1e3,
                                     f"bare Unix socket round trip, {name}"))
            if flood:
                stats = attack.stats
                asked = sum(n for k, n in stats.items() if k.startswith("status "))
                rows.append(("the flood (uid 65534)",
                             f"{stats['connected']:,} connections ({stats['held max']:,} held "
                             f"at most), {asked:,} STATUS requests in {stats['seconds']} s"))
                figures["flood"] = dict(stats)
    width = max(len(r[0]) for r in rows)
    print(f"gecod under a local user's flood on {g.host}, {g.ncpu} cpus, "
          f"Python {sys.version.split()[0]}")
    for label, value in rows:
        print(f"  {label:<{width}}  {value}")
    out = os.environ.get("GECO_FIGURES_DIR")
    if out:
        Path(out, "flood.json").write_text(json.dumps(figures, indent=1))
    write_rows(args.json, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
