"""Append to a job's stderr file as the job's owner, never as root.

:func:`stderr_target` finds the file from the job's execd spool dir;
:func:`append_to_owner_file` writes it from a child process that has dropped
to the owner, so a path the user chose cannot make root write elsewhere. A
job with a private /tmp ([tmp] private) has a mount namespace of its own: the
child enters it first (:class:`JobNamespace`), so the path is the job's file,
never one another user made at that path in the node's /tmp. It blocks (a
fork per call, a hung file system costs up to its timeout): run it in a
worker. gecod needs CAP_SETUID and CAP_SETGID for it (CAP_SYS_ADMIN and
CAP_SYS_CHROOT to enter a job's namespace), and the owners'
output files writable in its mount namespace (no
``ProtectHome=``/``ProtectSystem=strict`` over them).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import pwd
import select
import signal
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from geco.errors import GecoError
from geco.sge import execd

__all__ = ["JobNamespace", "StderrTarget", "append_to_owner_file", "stderr_target",
           "tell_owner"]


# ---------------------------------------------------------------------------
# the job's stderr file, written as its owner
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobNamespace:
    """The job's mount namespace here (its private /tmp), in which its paths are opened.

    Attributes
    ----------
    pin: where it is pinned (:func:`geco.job.privatetmp.namespace`); no file there: the
        job has none (private /tmp off, or ``on_failure = "shared"``).
    node_ns: the node's mount namespace (``[tmp] node_namespace``), entered first
        to see the pin (gecod under systemd runs in its unit's); "" = gecod's own.
    pinned: the pin was there when the job was looked up: when it is gone, so is
        the job's /tmp (the job ended), and nothing is written.
    """

    pin: Path
    node_ns: str = ""
    pinned: bool = False


@dataclass(frozen=True, slots=True)
class StderrTarget:
    """Where the job's stderr goes, and whose it is.

    Attributes
    ----------
    path: the file; or, when it came from ``-e <dir>`` (the default: the
        working directory), the directory the file is in.
    name_in_dir: the file's name when ``path`` is a directory
        (``<job_name>.e<job_id>[.<task>]``, as sge_shepherd names it); ""
        when ``path`` is known to be the file.
    owner: the job owner's user name (``job_owner`` in the spooled config).
    namespace: the job's mount namespace, where ``path`` is the job's; None =
        the node's (gecod's).
    """

    path: Path
    name_in_dir: str
    owner: str
    namespace: JobNamespace | None = None


def _read_env(path: Path) -> dict[bytes, bytes]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise GecoError.from_oserror("cannot read the job's spooled environment", exc,
                                     path=path) from exc
    return execd.parse_key_values(data)


def stderr_target(spool_dir: Path, namespace: JobNamespace | None = None
                  ) -> StderrTarget | None:
    """Return where the job's stderr goes, from its execd spool dir (``active_jobs/<job>.<task>``).

    ``SGE_STDERR_PATH`` (``SGE_STDOUT_PATH`` when ``merge_stderr`` is 1, i.e.
    ``-j y``) from the spooled ``environment`` when it is there. Son of Grid
    Engine 8.1.9 does not spool those (sge_shepherd sets them for the job
    only), so then ``stderr_path``/``stdout_path`` from the spooled
    ``config``: a file, or a directory in which sge_shepherd names the file
    ``<job_name>.e<job_id>`` (``.<task>`` for array tasks). Whether it is a
    directory is decided when writing, as the owner: root may not even see
    into an NFS home (root_squash). ``namespace``: the job's mount namespace,
    where the path is opened.

    Returns
    -------
    The target, or None when the job's stderr goes to ``/dev/null`` or nowhere.

    Raises
    ------
    GecoError
        when the spool's ``config`` cannot be read or names no ``job_owner``.
    """
    config = execd.read_config(spool_dir)
    owner = config.get("job_owner", "")
    if not owner:
        raise GecoError("the job's spooled config names no job_owner",
                        path=spool_dir / "config")
    merged = config.get("merge_stderr", "0").strip().lower() in ("1", "true", "yes", "y")
    env = _read_env(spool_dir / "environment")
    from_env = env.get(b"SGE_STDOUT_PATH" if merged else b"SGE_STDERR_PATH", b"")
    if from_env:
        path = Path(os.fsdecode(from_env))
        return None if path == Path("/dev/null") else StderrTarget(path, "", owner, namespace)
    raw = config.get("stdout_path" if merged else "stderr_path", "")
    if not raw or Path(raw) == Path("/dev/null"):
        return None
    path = Path(raw)
    if not path.is_absolute():
        path = Path(config.get("cwd", "/")) / path
    task = config.get("ja_task_id", "0")
    name = f"{config.get('job_name', '')}.{'o' if merged else 'e'}{config.get('job_id', '')}"
    if task not in ("", "0"):
        name += f".{task}"
    return StderrTarget(path, name, owner, namespace)


# O_NONBLOCK: a FIFO the owner put in the file's place opens at once (ENXIO without a
# reader) instead of holding the writer, and with a reader it is refused as not a file
_APPEND_FLAGS = (os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY
                 | os.O_NONBLOCK)
_WHY = {errno.ENOENT: "the file is gone, and geco never creates one",
        errno.ELOOP: "it is a symbolic link, which geco does not follow",
        errno.EACCES: "the job owner may not write it",
        errno.EPERM: "the job owner may not write it",
        errno.EISDIR: "it is a directory",
        errno.ENOTDIR: "a part of the path is not a directory",
        errno.ENXIO: "it is a FIFO or a device, which geco does not write to"}


_CLONE_NEWNS = 0x00020000  # os.CLONE_NEWNS is Python 3.12's


@dataclass(frozen=True, slots=True)
class _Join:
    """A :class:`JobNamespace` as the forked child uses it (prepared before the fork)."""

    node_ns: bytes
    pin: bytes
    pinned: bool
    setns: Callable[[int, int], None]


@functools.cache
def _libc_setns() -> Callable[[int, int], None]:
    """libc's setns(2), raising OSError (os.setns is Python 3.12's; Debian 12 has 3.11);
    made before a fork: the child only makes system calls."""
    import ctypes  # a job with a private /tmp only

    func = ctypes.CDLL(None, use_errno=True).setns
    func.argtypes = (ctypes.c_int, ctypes.c_int)
    func.restype = ctypes.c_int

    def setns(fd: int, nstype: int) -> None:
        if func(fd, nstype) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))

    return setns


def _setns(join: _Join, fd: int) -> None:
    join.setns(fd, _CLONE_NEWNS)


def _enter_node_namespace(join: _Join) -> None:
    """The node's mount namespace, where the pin is (as geco-mntns enters it)."""
    if not join.node_ns:
        return
    try:
        fd = os.open(join.node_ns, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return  # an init this root may not look at (a container's): gecod's is the node's
    try:
        node, mine = os.fstat(fd), os.stat("/proc/self/ns/mnt")
        if (node.st_dev, node.st_ino) != (mine.st_dev, mine.st_ino):
            _setns(join, fd)
    finally:
        os.close(fd)


def _enter_job_namespace(join: _Join) -> None:
    """The job's pinned namespace; none pinned, and none seen before: the node's is the
    job's. A pin that is no namespace (a plain file) is refused by setns: nothing written."""
    try:
        fd = os.open(join.pin, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        if join.pinned:
            raise  # the job's /tmp is gone with it: its path here is someone else's
        return
    try:
        _setns(join, fd)
    finally:
        os.close(fd)


def _append_child(result: int, path: bytes, alternative: bytes, data: bytes, uid: int,
                  gid: int, join: _Join | None) -> None:
    """The forked child: enter the job's mount namespace (``join``) while root, become
    the owner, append; report ``ok <n>`` or ``<errno> <step> <n>``.

    ``<n>`` says which path it was at: 0 = ``path``, 1 = ``alternative``.
    """
    step, which = "setgroups", 0
    # gecod's signal wake-up fd is inherited: a signal sent to this child (it
    # runs as the user, who may signal it) must not look like one to gecod
    signal.pthread_sigmask(signal.SIG_SETMASK, signal.valid_signals())
    try:
        if join is not None:
            step = "node-ns"
            _enter_node_namespace(join)
            step = "join"
            _enter_job_namespace(join)
            step = "setgroups"
        os.setgroups([])
        step = "setgid"
        os.setgid(gid)
        step = "setuid"
        os.setuid(uid)
        step = "open"
        try:
            fd = os.open(path, _APPEND_FLAGS)
        except IsADirectoryError:
            if not alternative:
                raise
            which = 1
            fd = os.open(alternative, _APPEND_FLAGS)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            os.write(result, f"0 type {which}".encode("ascii"))
            return
        step = "write"
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.close(fd)
        os.write(result, f"ok {which}".encode("ascii"))
    except OSError as exc:
        os.write(result, f"{exc.errno or 0} {step} {which}".encode("ascii"))


def append_to_owner_file(path: Path, text: str, uid: int, gid: int, *, name_in_dir: str = "",
                         timeout: float = 10.0, namespace: JobNamespace | None = None) -> Path:
    """Append ``text`` to the owner's file ``path``, with the owner's rights only.

    A child process drops to the owner (no supplementary groups, ``gid``,
    ``uid``) before it opens the file with ``O_APPEND|O_NOFOLLOW`` and without
    ``O_CREAT``: geco never creates a file, never follows a symbolic link the
    user put in the file's place, and cannot write anything the owner could
    not -- a path the user chose cannot make root write elsewhere. A hung file
    system (NFS) costs at most ``timeout``. With ``namespace`` the child first
    enters the job's mount namespace (as root: setns), so that ``path`` is the
    file the job has there; when the job's pin is there but cannot be entered,
    or is gone since it was seen, nothing is written (never the node's file).

    Parameters
    ----------
    path: the file, or a directory when ``name_in_dir`` is given.
    text: appended as UTF-8, as it is (add the newline yourself).
    uid, gid: the owner's ids.
    name_in_dir: when ``path`` turns out to be a directory, append to
        ``path/name_in_dir`` instead.
    timeout: seconds to wait for the child; it is then killed.
    namespace: the job's mount namespace; None = gecod's.

    Returns
    -------
    The file written to.

    Raises
    ------
    GecoError
        naming the path and the reason (gone, a symbolic link, not writable
        by the owner, a directory, timed out, the job's namespace not entered);
        never an ``OSError``.
    """
    alternative = path / name_in_dir if name_in_dir else None
    data = text.encode("utf-8", "surrogateescape")
    # everything the child needs is prepared here: it only makes system calls
    raw_path = os.fsencode(path)
    raw_alternative = os.fsencode(alternative) if alternative is not None else b""
    join = None if namespace is None else _Join(
        os.fsencode(namespace.node_ns), os.fsencode(namespace.pin), namespace.pinned,
        _libc_setns())
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    try:
        pid = os.fork()
    except OSError as exc:
        os.close(read_end)
        os.close(write_end)
        raise GecoError.from_oserror(f"cannot fork to append to {path}", exc,
                                     path=path) from exc
    if pid == 0:  # the child: never returns
        code = 1
        try:
            os.close(read_end)
            _append_child(write_end, raw_path, raw_alternative, data, uid, gid, join)
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        ready, _, _ = select.select([read_end], [], [], timeout)
        answer = os.read(read_end, 64) if ready else None
    finally:
        os.close(read_end)
    if answer is None:
        _kill_and_reap(pid)
        raise GecoError(f"cannot append to {path} as uid {uid}: no answer within "
                        f"{timeout:g} s (a hung file system?); the writer was killed",
                        path=path, uid=uid)
    _reap(pid)
    fields = answer.decode("ascii", "replace").split()
    if not fields:
        raise GecoError(f"cannot append to {path} as uid {uid}: the writer exited without "
                        f"an answer", path=path, uid=uid)
    if len(fields) == 2 and fields[0] == "ok":
        return alternative if fields[1] == "1" and alternative is not None else path
    code = int(fields[0]) if fields[0].isdigit() else 0
    step = fields[1] if len(fields) > 1 else "start"
    where = alternative if fields[2:] == ["1"] and alternative is not None else path
    if step == "type":
        raise GecoError(f"cannot append to {where} as uid {uid}: it is not a regular file (a "
                        "FIFO, a device or a socket), which geco does not write to",
                        path=where, uid=uid)
    cause = OSError(code, os.strerror(code) if code else "the writer died")
    if step in ("node-ns", "join") and namespace is not None:
        raise _not_joined(path, uid, namespace, step, cause) from cause
    err = GecoError.from_oserror(f"cannot append to {where} as uid {uid} ({step})", cause,
                                 path=where, uid=uid)
    why = _WHY.get(code, "") if step in ("open", "write") else ""
    if why:
        err = GecoError(f"{err.msg}; {why}", **err.fields)
    raise err from cause


_NOT_WRITTEN = "; nothing is written: at that path the node may have another user's file"


def _not_joined(path: Path, uid: int, namespace: JobNamespace, step: str,
                cause: OSError) -> GecoError:
    """The error of a writer that could not enter the job's mount namespace."""
    fields = {"path": path, "uid": uid, "pin": namespace.pin}
    if step == "join" and cause.errno == errno.ENOENT:
        return GecoError(f"cannot append to {path} as uid {uid}: the job's private /tmp "
                         f"is gone (its namespace, pinned at {namespace.pin}, was dropped: "
                         f"the job ended){_NOT_WRITTEN}", **fields)
    where = f"the node's ({namespace.node_ns})" if step == "node-ns" else \
        f"the job's (its private /tmp, pinned at {namespace.pin})"
    err = GecoError.from_oserror(f"cannot append to {path} as uid {uid}: cannot enter "
                                 f"{where} mount namespace", cause, **fields)
    return GecoError(f"{err.msg}{_NOT_WRITTEN}", **err.fields)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _kill_and_reap(pid: int) -> None:
    """SIGKILL the writer; reap it now, or in a thread when it is stuck in the kernel (NFS)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done:
            return
        time.sleep(0.01)
    threading.Thread(target=_reap, args=(pid,), name=f"geco-oom-reap-{pid}",
                     daemon=True).start()


def tell_owner(target: StderrTarget, text: str, *, timeout: float = 10.0) -> None:
    """Append ``text`` to the job's stderr file ``target``, as its owner (blocks).

    Raises
    ------
    GecoError
        when the owner is unknown here or the file could not be written.
    """
    uid, gid = _owner_ids(target.owner)
    append_to_owner_file(target.path, text, uid, gid, name_in_dir=target.name_in_dir,
                         timeout=timeout, namespace=target.namespace)


def _owner_ids(user: str) -> tuple[int, int]:
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise GecoError(f"the job owner {user!r} is not a known user on this node",
                        user=user) from None
    return pw.pw_uid, pw.pw_gid
