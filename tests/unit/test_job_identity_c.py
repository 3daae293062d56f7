"""libgeco/geco_job.c against tests/vectors/job_identity.json, the vectors geco.jobkey meets.

The C file is compiled here, from source, into pytest's temporary directory (never into
the repo), as a cffi extension under UBSan, so a signed overflow or a bad shift aborts
the test; and alone with strict warnings, to check that it calls nothing the preload may
not call in sge_execd's forked child (no allocator, no stdio, no lock).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.ckit import LIBGECO, REPO, ubsan_module, undefined_calls

SOURCE = LIBGECO / "geco_job.c"
VECTORS = json.loads((REPO / "tests" / "vectors" / "job_identity.json").read_text())
STRICT = ["-std=c11", "-Wall", "-Wextra", "-Wpedantic", "-Wconversion", "-Wsign-conversion",
          "-Wshadow", "-Werror"]

CDEF = """
uint64_t geco_job_id(const char *s, size_t n);
uint64_t geco_task_id(const char *s, size_t n);
int geco_job_of(const char *job_text, const char *task_text, uint64_t *job, uint64_t *task);
int geco_job_from_environment(const char *path, uint64_t *job, uint64_t *task, int *sys_errno);
const char *geco_env_strerror(int result);
"""


class C:
    """The compiled geco_job.c, with Python-friendly calls."""

    def __init__(self, ffi: Any, lib: Any) -> None:
        self.ffi, self.lib = ffi, lib

    def job_id(self, text: str) -> int:
        data = text.encode()
        return int(self.lib.geco_job_id(self.ffi.from_buffer(data or b"\0"), len(data)))

    def task_id(self, text: str | None) -> int:
        if text is None:
            return int(self.lib.geco_task_id(self.ffi.NULL, 0))
        data = text.encode()
        return int(self.lib.geco_task_id(self.ffi.from_buffer(data or b"\0"), len(data)))

    def job_of(self, job: str, task: str | None) -> tuple[int, int] | None:
        out = self.ffi.new("uint64_t[2]", [7, 7])
        task_text = self.ffi.NULL if task is None else self.ffi.new("char[]", task.encode())
        rc = self.lib.geco_job_of(self.ffi.new("char[]", job.encode()), task_text, out, out + 1)
        if rc != 0:
            assert (out[0], out[1]) == (7, 7), "a refusal leaves the ids alone"
            return None
        return int(out[0]), int(out[1])

    def from_environment(self, path: Path) -> tuple[int, int, str]:
        """``(job, task, what geco_env_strerror says)``; job and task 0 when refused."""
        out = self.ffi.new("uint64_t[2]")
        errno = self.ffi.new("int *")
        rc = self.lib.geco_job_from_environment(str(path).encode(), out, out + 1, errno)
        return int(out[0]), int(out[1]), self.ffi.string(self.lib.geco_env_strerror(rc)).decode()


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> C:
    module = ubsan_module("_geco_job_test", CDEF, "geco_job.h", ["geco_job.c"],
                          tmp_path_factory.mktemp("geco_job_cffi"))
    return C(module.ffi, module.lib)


def test_the_c_compiles_warning_free_and_calls_nothing_that_allocates_or_locks(
        tmp_path: Path) -> None:
    """Given geco_job.c, when compiled with strict warnings at -O0 and -O2, then it builds,
    and its object calls only open, fstat, read, close and mem*/strlen (the preload's
    promise on the exec path)."""
    allowed = {"open", "open64", "fstat", "fstat64", "__fxstat", "__fxstat64", "read", "close",
               "memcmp", "memcpy", "strlen", "__errno_location", "__stack_chk_fail"}
    for opt, undefined in undefined_calls(SOURCE, STRICT, tmp_path).items():
        assert undefined <= allowed, f"{opt}: unexpected calls {sorted(undefined - allowed)}"


@pytest.mark.parametrize("vector", VECTORS["job_id"]["accepted"], ids=repr)
def test_c_reads_an_accepted_job_id_as_its_number(c: C, vector: dict[str, Any]) -> None:
    assert c.job_id(vector["text"]) == vector["id"]
    assert c.job_of(vector["text"], None) == (vector["id"], 1)


@pytest.mark.parametrize("text", VECTORS["job_id"]["refused"], ids=repr)
def test_c_refuses_a_refused_job_id(c: C, text: str) -> None:
    assert c.job_id(text) == 0
    if "\0" not in text:
        assert c.job_of(text, "1") is None


@pytest.mark.parametrize("vector", VECTORS["task_id"]["accepted"], ids=repr)
def test_c_reads_an_accepted_task_id_as_its_task(c: C, vector: dict[str, Any]) -> None:
    assert c.task_id(vector["text"]) == vector["id"]
    assert c.job_of("42", vector["text"]) == (42, vector["id"])


@pytest.mark.parametrize("text", VECTORS["task_id"]["refused"], ids=repr)
def test_c_refuses_a_refused_task_id(c: C, text: str) -> None:
    assert c.task_id(text) == 0
    assert c.job_of("42", text) is None


@pytest.mark.parametrize("vector", VECTORS["environment"]["accepted"], ids=lambda v: v["name"])
def test_c_reads_the_job_an_environment_file_names(c: C, vector: dict[str, Any],
                                                   tmp_path: Path) -> None:
    (tmp_path / "environment").write_bytes(vector["text"].encode())
    assert c.from_environment(tmp_path / "environment") == (vector["job"], vector["task"], "ok")


@pytest.mark.parametrize("vector", VECTORS["environment"]["refused"], ids=lambda v: v["name"])
def test_c_says_why_an_environment_file_names_no_job(c: C, vector: dict[str, Any],
                                                     tmp_path: Path) -> None:
    (tmp_path / "environment").write_bytes(vector["text"].encode())
    assert c.from_environment(tmp_path / "environment") == (0, 0, vector["why"])
