"""The Grid Engine tests' job directory (probe.py in a directory the test user owns),
for the tests that run in the QEMU machine too."""

from tests.integration.conftest import job_dir  # noqa: F401 -- a fixture, found by name
