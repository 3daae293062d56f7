"""geco.jobkey's reading of Grid Engine's job ids against tests/vectors/job_identity.json.

The same vectors test the C twin (libgeco/geco_job.c) in test_job_identity_c.py: one rule
for what JOB_ID, SGE_TASK_ID and a spooled environment file mean, and what is refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from geco.errors import JobKeyError
from geco.jobkey import JOB_ID_RULE, TASK_ID_RULE, JobKey
from geco.sge import execd

VECTORS = json.loads((Path(__file__).resolve().parents[1] / "vectors" / "job_identity.json")
                     .read_text())


def test_the_rules_words_are_the_vectors() -> None:
    assert (VECTORS["job_rule"], VECTORS["task_rule"]) == (JOB_ID_RULE, TASK_ID_RULE)


@pytest.mark.parametrize("vector", VECTORS["job_id"]["accepted"], ids=repr)
def test_an_accepted_job_id_means_its_number(vector: dict[str, Any]) -> None:
    assert JobKey.job_of(vector["text"]) == vector["id"]
    assert JobKey.job_of(vector["text"].encode()) == vector["id"]


@pytest.mark.parametrize("text", VECTORS["job_id"]["refused"], ids=repr)
def test_a_refused_job_id_is_refused_in_the_rules_words(text: str) -> None:
    """Given a job id Grid Engine does not write, then it is refused (as JOB_ID and as a
    key's job), and the error says the rule and the input."""
    with pytest.raises(JobKeyError) as info:
        JobKey.job_of(text)
    assert str(info.value) == f"{VECTORS['job_rule']}, got {text!r}"
    with pytest.raises(JobKeyError):
        JobKey.from_sge(text, "1")


@pytest.mark.parametrize("vector", VECTORS["task_id"]["accepted"], ids=repr)
def test_an_accepted_task_id_means_its_task(vector: dict[str, Any]) -> None:
    """Given a task id as Grid Engine writes it (absent, "", 0 or undefined: not an array
    job), then it names that task, and the key with job 42 is 42.<task>."""
    assert JobKey.task_of(vector["text"]) == vector["id"]
    assert JobKey.from_sge("42", vector["text"]) == f"42.{vector['id']}"


@pytest.mark.parametrize("text", VECTORS["task_id"]["refused"], ids=repr)
def test_a_refused_task_id_is_refused_in_the_rules_words(text: str) -> None:
    with pytest.raises(JobKeyError) as info:
        JobKey.from_sge("42", text)
    assert str(info.value) == f"{VECTORS['task_rule']}, got {text!r}"


def test_a_messages_task_number_zero_is_task_one() -> None:
    """Given the ids a message carries (ints), then task 0 is task 1, as its text."""
    assert [JobKey.task_of(n) for n in (0, 1, 27)] == [1, 1, 27]
    with pytest.raises(JobKeyError):
        JobKey.task_of(10**19)


@pytest.mark.parametrize("vector", VECTORS["environment"]["accepted"], ids=lambda v: v["name"])
def test_an_environment_file_names_its_job(vector: dict[str, Any]) -> None:
    key = execd.key_of_environment(vector["text"].encode())
    assert (key.job, key.task) == (vector["job"], vector["task"])


@pytest.mark.parametrize("vector", VECTORS["environment"]["refused"], ids=lambda v: v["name"])
def test_an_environment_file_that_names_no_job_says_why(vector: dict[str, Any]) -> None:
    with pytest.raises(JobKeyError) as info:
        execd.key_of_environment(vector["text"].encode())
    assert str(info.value).startswith(vector["why"])
