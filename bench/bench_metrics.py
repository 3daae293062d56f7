"""What gecod's Prometheus endpoint costs: a scrape of 1,000 jobs, its size, its rendering.

Run from the repo root (needs python3-prometheus-client; no root, no cgroups):

    /opt/geco-dev/venv/bin/python -m bench.bench_metrics [--jobs 1000] [--runs 30] [--json PATH]

* ``--jobs`` jobs in the sampler's snapshot (every figure counted, as on a cgroup v2
  node), served by gecod's own endpoint (:class:`geco.daemon.metrics.Endpoint` and
  :class:`geco.usage.exposition.Renderer`) on a loopback port: the median time of a
  whole scrape as Prometheus makes it (connect, ``GET /metrics``, read to the end; goal
  <= 50 ms), beside the floor of the same bytes from a bare socket server in the same
  process; and the response's size.
* The rendering of the snapshot, done once per sampler round in the sampler's thread
  (no scrape waits for it): the best of ``--runs``.
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import time

from bench._common import median_time
from bench._table import Row, add_json_option, write_rows
from geco.daemon import metrics
from geco.usage.sampler import Health, JobFigures, NodeFigures, Snapshot
from geco.usage.samples import Header, Sample


def _snapshot(jobs: int) -> Snapshot:
    """``jobs`` running jobs of 50 owners, every figure the kernel can count."""
    now = time.time()
    figures = tuple(JobFigures(
        Header(1_000_000 + i, 1 + i % 3, owner=f"user{i % 50:02d}", job_name="bench",
               queue="all.q", host="node0001", cores=1 + i % 8, memory=(1 + i % 16) << 30,
               gpus=i % 2, started=now - 3600 - i),
        Sample(now, cpu_user_usec=3_000_000_000 + i * 7919, cpu_system_usec=20_000_000 + i,
               memory_current=(300 + i) << 20, memory_peak=(400 + i) << 20, tasks=4 + i % 9,
               oom_kills=i % 2, memory_pressure_usec=i, io_read_bytes=i << 20,
               io_write_bytes=i << 10))
        for i in range(jobs))
    node = NodeFigures(cores=jobs, cores_free=jobs // 10, memory=jobs << 32,
                       memory_free=jobs << 30, memory_used=jobs << 31, jobs=jobs)
    return Snapshot(now, figures, node, rounds=120)


def _get(port: int) -> int:
    """One scrape as Prometheus makes it: the bytes of the whole reply."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nAccept: text/plain\r\n\r\n")
        size = 0
        while chunk := s.recv(1 << 20):
            size += len(chunk)
    return size


def _bare_server(reply: bytes) -> tuple[socket.socket, threading.Thread]:
    """The floor: a socket server that answers any request with ``reply``, as fast as
    Python's sockets go (one thread, the same loopback, no rendering, no parsing)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data and (chunk := conn.recv(8192)):
                    data += chunk
                conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=30)
    add_json_option(parser)
    args = parser.parse_args()
    try:
        from geco.usage import exposition
    except ImportError as exc:
        print(f"bench_metrics: the Prometheus client library is missing ({exc}): install "
              f"python3-prometheus-client", file=sys.stderr)
        return 1
    snap = _snapshot(args.jobs)
    renderer = exposition.Renderer(lambda: snap, lambda: Health(123456, 78, 3),
                                   "node0001")

    def prepare() -> None:
        renderer._made = None  # every run renders the round afresh
        renderer.prepare()

    render_s = min(median_time(1, prepare) for _ in range(max(3, args.runs // 5)))
    renderer.prepare()
    endpoint = metrics.Endpoint(metrics.listener(metrics.Listen("127.0.0.1", 0)), renderer,
                                "bench")
    endpoint.start()
    try:
        port = endpoint.listener.getsockname()[1]
        size = _get(port)  # warm
        scrape_s = median_time(args.runs, lambda: _get(port))
        body = renderer.render()
    finally:
        endpoint.close()
    bare, thread = _bare_server(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
                                + body)
    try:
        bare_port = bare.getsockname()[1]
        _get(bare_port)
        floor_s = median_time(args.runs, lambda: _get(bare_port))
    finally:
        bare.close()
        thread.join(timeout=10)
    jobs = f"{args.jobs:,} jobs"
    rows = [
        Row(f"metrics scrape of {jobs} (GET /metrics, loopback, median)", scrape_s * 1000,
            "ms", goal="<= 50", floor=floor_s * 1000,
            floor_label="the same bytes from a bare socket server"),
        Row(f"metrics response for {jobs}", size / 1024, "KiB"),
        Row(f"metrics rendering of {jobs}, once per sampler round (its thread)",
            render_s * 1000, "ms"),
    ]
    for row in rows:
        floor = f" (floor {row.floor:.2f} {row.unit}: {row.floor_label})" if row.floor else ""
        print(f"{row.figure}: {row.measured:.2f} {row.unit}{floor}; goal {row.goal}")
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
