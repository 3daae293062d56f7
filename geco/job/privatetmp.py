"""A job's private /tmp, /var/tmp and /dev/shm on this host: one mount namespace per job.

Each job task gets, on each of its hosts, a mount namespace of its own
(made by ``geco-mntns``, a small C program: a namespace is made and pinned in about a
millisecond), a slave of the host's (the node's mounts reach it, none of its own leave
it) in which

- ``/tmp`` (and ``/var/tmp``, ``[tmp] var_tmp``) is the job's own directory under
  ``[tmp] base`` (``<base>/<job>.<task>/tmp``, ``.../var-tmp``: root's, mode 1777, as the
  node's are);
- ``/dev/shm`` is a new tmpfs of ``[tmp] shm_size`` (a share of the job's memory limit,
  or a size), whose pages count against the job's memory cgroup (the job's processes
  write them);
- every mount is nosuid and nodev: the job's files gain nothing there.

The namespace is pinned by a bind mount of its nsfs file on ``<state_dir>/mntns/<job>.<task>``
(a private mount, so the pin never propagates into a namespace): a process joins it with
``setns`` on that file (the exec() preload, before the shepherd runs; ``nsenter -m``), and
it lives until it is dropped and its last process has exited. :func:`remove` (the job's
end) drops it and deletes the job's directories, whatever the job left in them, and says
what was freed.

``[tmp] base`` is made root's, mode 0700, and refused when it is anything else (a link,
another owner, writable by others): no user can plant a link or a file in it, and every
deletion in it is done by file descriptor, never following a link the job made in its
``/tmp``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from geco import jobfiles, log
from geco._tuple import NamedTuple
from geco.config import Config
from geco.errors import GecoError
from geco.jobkey import JobKey
from geco.units import format_memory, parse_memory

TYPE_CHECKING = False
if TYPE_CHECKING:
    from geco.oom.asowner import JobNamespace

__all__ = ["HELPER", "Freed", "Places", "add_sge_tmpdir", "describe", "exists", "free", "make",
           "namespace", "places", "remove", "shm_bytes"]

_log = log.get("job.privatetmp")

HELPER = Path("/usr/libexec/geco/geco-mntns")
_BASE_MODE = 0o700
_PINS_MODE = 0o711
_JOB_MODE = 0o755
_TMP_MODE = 0o1777
# Seconds the helper may take (it makes a few mounts: milliseconds).
_HELPER_TIMEOUT = 30.0
_PAGE = os.sysconf("SC_PAGE_SIZE")


class Places(NamedTuple):
    """Where a job's namespace and directories are on this host."""

    pin: Path
    job_dir: Path
    tmp: Path
    var_tmp: Path | None


class Freed(NamedTuple):
    """What a job left in its private places, freed at its end (bytes)."""

    tmp: int
    shm: int


def places(cfg: Config, key: JobKey) -> Places:
    job_dir = jobfiles.tmp_dir(cfg, key)
    return Places(jobfiles.namespace_pin(cfg.state_dir, key), job_dir, job_dir / "tmp",
                  job_dir / "var-tmp" if cfg.tmp_var_tmp else None)


def namespace(cfg: Config, key: JobKey) -> JobNamespace:
    """Job ``key``'s mount namespace here, where its paths are the job's (an OOM report for
    its ``-e /tmp/...`` file is written there), noting whether it is pinned now."""
    from geco.oom.asowner import JobNamespace  # gecod's OOM reports only

    pin = places(cfg, key).pin
    return JobNamespace(pin, cfg.tmp_node_namespace, os.path.lexists(pin))


def shm_bytes(cfg: Config, memory_limit: int, jobs_memory: int) -> int:
    """The cap of the job's ``/dev/shm``: ``[tmp] shm_size`` of its memory limit here (of
    ``jobs_memory``, what all jobs may use, when it has none), or the size it names; whole
    pages, one at least."""
    rule = cfg.tmp_shm_size
    if rule.endswith("%"):
        size = (memory_limit or jobs_memory) * int(rule[:-1]) // 100
    else:
        size = parse_memory(rule) or 0
    return max(_PAGE, size // _PAGE * _PAGE)


def describe(cfg: Config) -> str:
    """One line for ``geco check``."""
    if not cfg.tmp_private:
        return ("no private /tmp ([tmp] private = false): jobs share the node's /tmp and "
                "/dev/shm")
    paths = "/tmp, /var/tmp" if cfg.tmp_var_tmp else "/tmp"
    shm = cfg.tmp_shm_size + (" of its memory limit" if cfg.tmp_shm_size.endswith("%") else "")
    base = places(cfg, JobKey(1, 1)).job_dir.parent
    free = f", while {format_memory(cfg.tmp_min_free)} are free there" if cfg.tmp_min_free else ""
    failure = {"requeue": "not run (re-queued)",
               "shared": "run with the node's"}[cfg.tmp_on_failure]
    line = (f"each job gets a private {paths} (under {base}{free}) and /dev/shm ({shm}), "
            f"gone when it ends; a job that cannot get them: {failure}; nodes without the "
            f"exec() preload: none")
    if not HELPER.exists():
        line += f"; but {HELPER} is missing: reinstall the geco package"
    return line


def exists(cfg: Config, key: JobKey) -> bool:
    """True when the job has a namespace pinned here."""
    return os.path.lexists(places(cfg, key).pin)


def make(cfg: Config, key: JobKey, memory_limit: int, jobs_memory: int) -> Places:
    """Make job ``key``'s namespace and directories (an earlier job's of the same number
    are removed first: Grid Engine reuses numbers). Grid Engine's ``$TMPDIR`` of each of
    its shepherds goes in with :func:`add_sge_tmpdir`.

    Raises
    ------
    GecoError
        naming what could not be made (the base unusable or full, the kernel's refusal).
    """
    where = places(cfg, key)
    remove(cfg, key)
    base = _open_base(where.job_dir.parent)
    try:
        _check_free(base, where.job_dir.parent, cfg.tmp_min_free)
        _make_dirs(base, where)
    finally:
        os.close(base)
    # 0711: a shepherd's exec (sge_execd's child, the admin user's euid) sees whether its
    # job has a pin before it becomes root again to enter it; the pins are root's 0600
    where.pin.parent.mkdir(mode=_PINS_MODE, parents=True, exist_ok=True)
    where.pin.parent.chmod(_PINS_MODE)
    argv = [*_helper(cfg), "make", str(where.pin), str(where.tmp),
            str(shm_bytes(cfg, memory_limit, jobs_memory))]
    if where.var_tmp is not None:
        argv.append(str(where.var_tmp))
    try:
        _run(argv)
    except GecoError:
        _remove_dir(where.job_dir)
        raise
    return where


def remove(cfg: Config, key: JobKey) -> Freed:
    """Drop job ``key``'s namespace (it goes with its last process) and delete its
    directories, whatever is in them or still open; what they held. Nothing to do is
    no error.

    Raises
    ------
    GecoError
        when the pin cannot be dropped or the directories not deleted.
    """
    where = places(cfg, key)
    shm = 0
    if os.path.lexists(where.pin):
        out = _run([*_helper(cfg), "drop", str(where.pin)])
        shm = int(out.split()[1]) if out.startswith("shm_used ") else 0
    tmp = 0
    if os.path.lexists(where.job_dir):
        tmp = _remove_dir(where.job_dir)
    return Freed(tmp, shm)


def free(cfg: Config, key: JobKey, journal: log.JobFields) -> Freed | None:
    """Remove the job's private /tmp and /dev/shm here, once its processes are gone; what
    they held (None when it had none, or when they could not be removed: journaled, the
    reaper tries again)."""
    where = places(cfg, key)
    if not (os.path.lexists(where.pin) or os.path.lexists(where.job_dir)):
        return None
    try:
        return remove(cfg, key)
    except GecoError as exc:
        _log.warning("job %s: its private /tmp is not removed: %s", key, exc,
                     extra=journal.event("private-tmp-left"))
        return None


def _helper(cfg: Config) -> list[str]:
    """The helper, entering ``[tmp] node_namespace`` first (gecod's own: none)."""
    node = cfg.tmp_node_namespace
    return [str(HELPER), "-n", node] if node else [str(HELPER)]


def _run(argv: list[str]) -> str:
    import subprocess  # a job with a private /tmp only: the epilog of others loads none

    verb = next(word for word in argv if word in ("make", "drop"))
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_HELPER_TIMEOUT,
                              env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, cwd="/",
                              check=False)
    except FileNotFoundError:
        raise GecoError(f"{HELPER} is missing: reinstall the geco package") from None
    except subprocess.TimeoutExpired:
        raise GecoError(f"{HELPER} {verb} took over {_HELPER_TIMEOUT:g} s") from None
    if done.returncode != 0:
        words = done.stderr.strip().splitlines()
        raise GecoError(words[-1] if words else f"{HELPER} {verb} exited {done.returncode}")
    return done.stdout


def _open_base(base: Path) -> int:
    """``[tmp] base``, made root's 0700 when missing, opened without following a link and
    checked: root's, not writable or readable by anyone else."""
    try:
        base.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # checked below, whoever made it
            base.mkdir(mode=_BASE_MODE)
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise GecoError.from_oserror("cannot use [tmp] base", exc, path=base) from exc
    st = os.fstat(fd)
    if st.st_uid != 0 or stat.S_IMODE(st.st_mode) & 0o077:
        os.close(fd)
        raise GecoError(f"[tmp] base {base} must be root's and closed to others (mode "
                        f"0700), got uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}: "
                        f"no job gets a private /tmp until it is", path=base)
    return fd


def _check_free(base: int, path: Path, min_free: int) -> None:
    """``[tmp] min_free``: the base has that much free, or no job starts a private /tmp."""
    if not min_free:
        return
    st = os.fstatvfs(base)
    free = st.f_bavail * st.f_frsize
    if free < min_free:
        raise GecoError(f"[tmp] base {path} has {format_memory(free)} free, under [tmp] "
                        f"min_free ({format_memory(min_free)})", path=path)


def _make_dirs(base: int, where: Places) -> None:
    """``<job>.<task>/`` and its ``tmp``, ``var-tmp`` in the base (by descriptor)."""
    name = where.job_dir.name
    try:
        os.mkdir(name, _JOB_MODE, dir_fd=base)
        job = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                      dir_fd=base)
        try:
            os.fchmod(job, _JOB_MODE)  # whatever the umask
            for sub in (where.tmp, where.var_tmp):
                if sub is not None:
                    os.mkdir(sub.name, _TMP_MODE, dir_fd=job)
                    os.chmod(sub.name, _TMP_MODE, dir_fd=job, follow_symlinks=False)
        finally:
            os.close(job)
    except OSError as exc:
        raise GecoError.from_oserror("cannot make the job's private /tmp", exc,
                                     path=where.job_dir) from exc


def add_sge_tmpdir(cfg: Config, key: JobKey, tmpdir: Path, uid: int) -> None:
    """Grid Engine's ``$TMPDIR`` for a task of job ``key``, made again inside its private
    /tmp or /var/tmp (sge_execd made it in the node's before the shepherd ran; each
    ``qrsh -inherit`` task gets one): a directory under /tmp or /var/tmp (a queue's
    ``tmpdir`` may be /tmp itself or a directory in it) that the job's owner ``uid``
    owns, with the directories on the way as the node has them (the path comes from the
    task's environment file, where a user's ``qsub -v TMPDIR=`` could put another: each
    step must be a real directory on the node, never a link). Elsewhere (a queue's tmpdir
    on scratch) the job sees the node's own, as without geco. What is there already (an
    earlier task's, or the job's own making) is left as it is, never followed.

    Raises
    ------
    GecoError
        when it cannot be made.
    """
    where = places(cfg, key)
    top = next((Path(node) for node in ("/tmp", "/var/tmp") if tmpdir.is_relative_to(node)),
               None)
    if top is None:
        return
    inside = {"/tmp": where.tmp, "/var/tmp": where.var_tmp}[str(top)]
    steps = tmpdir.relative_to(top).parts
    if inside is None or not steps or any(p in (".", "..") for p in steps):
        return
    node = []
    for depth in range(1, len(steps) + 1):
        try:
            st = os.lstat(top.joinpath(*steps[:depth]))
        except OSError:
            return
        if not stat.S_ISDIR(st.st_mode):
            return
        node.append(st)
    if node[-1].st_uid != uid:
        return
    try:
        fd = os.open(inside, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        for name, st in zip(steps, node, strict=True):
            fd = _step_into(fd, name, st)
        os.close(fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            return  # the job put something else there: its own /tmp, its own doing
        raise GecoError.from_oserror("cannot make the job's $TMPDIR in its private /tmp",
                                     exc, path=inside.joinpath(*steps)) from exc


def _step_into(parent: int, name: str, node: os.stat_result) -> int:
    """``name`` in the directory open as ``parent`` (closed, whatever happens), made as
    the node's ``node`` when missing (its owner and mode, set-id bits dropped); opened
    without following a link."""
    try:
        try:
            os.mkdir(name, 0o700, dir_fd=parent)
            made = True
        except FileExistsError:
            made = False
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                     dir_fd=parent)
    finally:
        os.close(parent)
    if made:
        try:
            # the mode while root owns it: gecod's unit has no CAP_FOWNER
            os.fchmod(fd, stat.S_IMODE(node.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
            os.fchown(fd, node.st_uid, node.st_gid)
        except OSError:
            os.close(fd)
            raise
    return fd


def _remove_dir(job_dir: Path) -> int:
    """Delete ``job_dir`` and everything in it (by descriptor: a link the job made is
    removed, never followed); the bytes its files held."""
    import shutil

    held = 0
    try:
        for _root, _dirs, files, fd in os.fwalk(job_dir, follow_symlinks=False):
            for name in files:
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    held += st.st_blocks * 512
        shutil.rmtree(job_dir)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise GecoError.from_oserror("cannot delete the job's private /tmp", exc,
                                     path=job_dir) from exc
    if held:
        _log.debug("%s: %s freed", job_dir, format_memory(held))
    return held
