"""A Grid Engine job directory: owned by the test user, holding probe.py, jobs submitted
from it (the ``job_dir`` fixture of tests/conftest.py makes one per test module)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROBE = Path(__file__).parent / "integration" / "probe.py"


@dataclass
class JobDir:
    """A directory owned by the test user, holding probe.py; jobs are submitted from it."""

    path: Path
    sge: Any
    owner: Any
    ids: list[int] = field(default_factory=list)

    def script(self, name: str, body: str) -> str:
        """Write ``<name>.sh`` (a /bin/sh script the test user owns); return its file name."""
        path = self.path / f"{name}.sh"
        path.write_text("#!/bin/sh\n" + body)
        os.chown(path, self.owner.uid, self.owner.gid)
        return path.name

    def submit(self, name: str, *qsub: str, probe: str = "", script: str = "") -> int:
        """Submit ``script`` (default: probe.py with ``probe`` arguments) with -cwd -N name."""
        body = script or f"exec /usr/bin/python3 probe.py {probe}\n"
        job = int(self.sge.submit("-cwd", "-N", name, *qsub, self.script(name, body),
                                  cwd=self.path))
        self.ids.append(job)
        return job

    def output(self, name: str, job: int, task: int | None = None, stream: str = "o") -> str:
        """The job's .o (or .e with stream="e") file."""
        suffix = f".{task}" if task else ""
        return (self.path / f"{name}.{stream}{job}{suffix}").read_text()

    def reports(self, name: str, job: int, task: int | None = None) -> list[dict[str, Any]]:
        """The JSON lines probe.py printed to the job's .o file."""
        return [json.loads(line) for line in self.output(name, job, task).splitlines() if line]
