"""The quarantine key file and `geco keygen`: only root may read it, never half-written."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from geco import atomicfile
from geco.errors import GecoError, KeyFileError
from geco.wire import keys

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="key files must be owned by root: needs root to create")


def geco(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "geco.cli", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=60, env=env)


def key_file(path: Path, data: bytes = bytes(range(32)), mode: int = 0o600) -> Path:
    path.write_bytes(data)
    path.chmod(mode)
    return path


def test_a_generated_key_is_32_random_bytes_mode_0600_owned_by_root(tmp_path: Path) -> None:
    """Given no key file (and no directory), when one is generated, then it is 32 bytes,
    0600, root's, loads back, leaves no temporary, and two keys differ."""
    path = keys.generate_key(tmp_path / "etc" / "quarantine.key")
    st = path.stat()
    assert (st.st_mode & 0o777, st.st_uid, st.st_size) == (0o600, 0, 32)
    assert keys.load_key(path) == path.read_bytes()
    assert os.listdir(path.parent) == ["quarantine.key"]
    other = keys.generate_key(tmp_path / "other.key")
    assert other.read_bytes() != path.read_bytes()


def test_generate_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    """Given an existing key, then generate_key leaves it alone and says how to replace it;
    with force it is replaced (atomically: the name never points at nothing)."""
    path = keys.generate_key(tmp_path / "q.key")
    old = path.read_bytes()
    with pytest.raises(KeyFileError) as info:
        keys.generate_key(path)
    assert str(info.value) == (f"the quarantine key file already exists; keep it, or replace it "
                               f"with `geco keygen --force {path}` and restart gecod, sge_execd "
                               f"and sshd (path={path})")
    assert path.read_bytes() == old
    assert os.listdir(tmp_path) == ["q.key"]
    keys.generate_key(path, force=True)
    assert path.read_bytes() != old and path.stat().st_mode & 0o777 == 0o600


def test_a_reader_never_sees_a_half_written_key(tmp_path: Path) -> None:
    """Given a key replaced (--force) over and over, when another thread loads it meanwhile,
    then every load succeeds with 32 bytes: the name always points at a whole file."""
    path = keys.generate_key(tmp_path / "q.key")
    errors: list[Exception] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            try:
                assert len(keys.load_key(path)) == 32
            except Exception as exc:  # collected and asserted below
                errors.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for _ in range(200):
            keys.generate_key(path, force=True)
    finally:
        stop.set()
        thread.join()
    assert errors == []
    assert os.listdir(tmp_path) == ["q.key"]


def test_a_write_error_leaves_nothing_behind(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(GecoError) as info:
        keys.generate_key(blocker / "etc" / "q.key")
    assert str(info.value).startswith("cannot write the quarantine key file: ")
    assert "errno=ENOTDIR" in str(info.value)
    assert os.listdir(tmp_path) == ["file"]


def test_write_atomic_without_overwrite_is_a_file_exists_error(tmp_path: Path) -> None:
    """Given the generic atomic writer with overwrite=False and a taken name, then it raises
    FileExistsError and removes its temporary."""
    path = tmp_path / "x"
    path.write_bytes(b"old")
    with pytest.raises(FileExistsError):
        atomicfile.write_atomic(path, b"new", mode=0o600, overwrite=False)
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["x"]


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_a_root_only_key_loads(tmp_path: Path, mode: int) -> None:
    path = key_file(tmp_path / "q.key", mode=mode)
    assert keys.load_key(path) == bytes(range(32))


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o602, 0o610])
def test_a_key_others_may_touch_is_refused_with_the_fix(tmp_path: Path, mode: int) -> None:
    path = key_file(tmp_path / "q.key", mode=mode)
    with pytest.raises(KeyFileError) as info:
        keys.load_key(path)
    assert str(info.value) == (
        f"the quarantine key file must not be accessible to group or others (mode 0600 or "
        f"0400), got {mode:04o}; fix: `chmod 600 {path}`, then `geco keygen --force {path}` "
        f"and restart gecod, sge_execd and sshd, since others may have read it (path={path})")


@pytest.mark.parametrize(("size", "shown"), [(0, "0"), (31, "31"), (33, "more than 32"),
                                             (4096, "more than 32")])
def test_a_key_of_the_wrong_size_is_refused(tmp_path: Path, size: int, shown: str) -> None:
    path = key_file(tmp_path / "q.key", data=b"k" * size)
    with pytest.raises(KeyFileError) as info:
        keys.load_key(path)
    assert str(info.value) == (f"the quarantine key file must hold exactly 32 bytes, got "
                               f"{shown}; fix: `geco keygen --force {path}` (path={path})")


def test_a_key_not_owned_by_root_is_refused(tmp_path: Path) -> None:
    path = key_file(tmp_path / "q.key")
    os.chown(path, NOBODY, NOBODY)
    with pytest.raises(KeyFileError) as info:
        keys.load_key(path)
    assert str(info.value) == (f"the quarantine key file must be owned by root, got uid "
                               f"{NOBODY}; fix: `chown root: {path}` (and check who could have "
                               f"changed it) (path={path})")


def test_a_missing_key_says_how_to_make_one(tmp_path: Path) -> None:
    path = tmp_path / "absent.key"
    with pytest.raises(KeyFileError) as info:
        keys.load_key(path)
    assert str(info.value) == (f"the quarantine key file does not exist; create it with "
                               f"`geco keygen {path}` (path={path})")


def test_a_directory_is_not_a_key(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir(mode=0o700)
    with pytest.raises(KeyFileError) as info:
        keys.load_key(tmp_path / "d")
    assert str(info.value) == (f"the quarantine key file must be a regular file; replace it "
                               f"with `geco keygen --force {tmp_path / 'd'}` "
                               f"(path={tmp_path / 'd'})")


def test_a_symlink_is_judged_by_its_target(tmp_path: Path) -> None:
    target = key_file(tmp_path / "real.key", mode=0o644)
    link = tmp_path / "q.key"
    link.symlink_to(target)
    with pytest.raises(KeyFileError, match="got 0644"):
        keys.load_key(link)
    target.chmod(0o600)
    assert keys.load_key(link) == bytes(range(32))


# ---------------------------------------------------------------------------
# geco keygen
# ---------------------------------------------------------------------------

def test_keygen_writes_the_configured_key_file_by_default(tmp_path: Path) -> None:
    """Given a config naming key_file, when `geco keygen` runs without PATH, then that file
    is written; a second run refuses (exit 1), --force replaces it."""
    path = tmp_path / "geco" / "quarantine.key"
    conf = tmp_path / "geco.toml"
    conf.write_text(f'[gecod]\nkey_file = "{path}"\n')
    env = dict(os.environ, GECO_CONFIG=str(conf))
    out = geco("keygen", env=env)
    assert (out.returncode, out.stderr) == (0, "")
    assert out.stdout == (f"geco keygen: wrote a new key to {path}; restart gecod, sge_execd "
                          f"and sshd to use it\n")
    first = keys.load_key(path)
    again = geco("keygen", env=env)
    assert again.returncode == 1
    assert again.stderr == (f"geco keygen: the quarantine key file already exists; keep it, or "
                            f"replace it with `geco keygen --force {path}` and restart gecod, "
                            f"sge_execd and sshd (path={path})\n")
    assert geco("keygen", "--force", env=env).returncode == 0
    assert keys.load_key(path) != first


def test_keygen_takes_an_explicit_path(tmp_path: Path) -> None:
    path = tmp_path / "k"
    out = geco("keygen", str(path))
    assert out.returncode == 0, out.stderr
    assert path.stat().st_mode & 0o777 == 0o600 and len(keys.load_key(path)) == 32
