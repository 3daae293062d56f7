"""Files only root writes and their owner reads: trace files, usage samples.

Without ACLs, one user besides root can read a file only through its group: the file
is ``root:<owner's primary group>``, mode 0640, when that group is the owner's alone
(the user-private-group convention of Debian, Red Hat and FreeIPA: a group named after
the user, with no other listed members). Otherwise -- a shared primary group such as
``users``, or an owner unknown on this host -- it is ``root:root`` 0600, and
:attr:`Readers.root_only` says why.

The directory is root-owned and nobody else can write to it. Every file operation is
done as root on a path whose last components a user could otherwise aim elsewhere, so
the directory is opened without following symlinks and checked (root-owned, not
group/other-writable), and the file is opened relative to that directory with
``O_NOFOLLOW`` and checked to be a regular file with one link.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import os
import pwd
import stat
import struct
from pathlib import Path

from geco import log
from geco._tuple import NamedTuple

_log = log.get("ownerread")

__all__ = ["DIR_FLAGS", "ROOT_ONLY_MODE", "Readers", "Refused", "open_dir", "open_in",
           "readers_of"]

FILE_MODE = 0o640       # root:<owner's private group>
ROOT_ONLY_MODE = 0o600  # root:root, when no group is the owner's alone
DIR_MODE = 0o755
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Refused(Exception):
    """A file that must not or cannot be written (the message says why)."""


class Readers(NamedTuple):
    """Who may read a job's file: the file's group and mode (its user is root), and the
    access ACL that names more readers (b"": none)."""

    gid: int
    mode: int
    root_only: str = ""  # why only root reads it ("" when the owner does)
    acl: bytes = b""


# system.posix_acl_access: version 2, then (tag, permissions, id) entries sorted by tag
# and id (the kernel's own format, <linux/posix_acl_xattr.h>)
_ACL_XATTR = "system.posix_acl_access"
_ACL_HEAD = struct.Struct("<I")
_ACL_ENTRY = struct.Struct("<HHI")
_USER_OBJ, _USER, _GROUP_OBJ, _GROUP, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_NO_ID = 0xFFFFFFFF
_READ, _READ_WRITE = 4, 6


def readers_of(name: str, groups: tuple[str, ...] = ()) -> Readers:
    """The group and mode of a file of a job of ``name``: readable by the owner through
    their private group, else by root only (and why); with ``groups`` (``[usage]
    readers``), an ACL lets their members and the owner read it too."""
    alone = _owner_alone(name)
    if not groups:
        return alone
    gids = sorted({g.gr_gid for g in map(_group, groups) if g is not None})
    uid = _uid(name)
    entries = [(_USER_OBJ, _READ_WRITE, _NO_ID),
               *([(_USER, _READ, uid)] if uid is not None else []),
               (_GROUP_OBJ, _READ if alone.gid else 0, _NO_ID),
               *((_GROUP, _READ, gid) for gid in gids if gid != alone.gid),
               (_MASK, _READ, _NO_ID), (_OTHER, 0, _NO_ID)]
    acl = _ACL_HEAD.pack(2) + b"".join(_ACL_ENTRY.pack(*e) for e in entries)
    # with an ACL the mode's group bits are its mask
    return Readers(alone.gid, FILE_MODE, alone.root_only, acl)


def _group(name: str) -> grp.struct_group | None:
    try:
        return grp.getgrnam(name)
    except KeyError:
        return None


def _uid(name: str) -> int | None:
    try:
        return pwd.getpwnam(name).pw_uid if name else None
    except (KeyError, UnicodeEncodeError):
        return None


def _owner_alone(name: str) -> Readers:
    """Readers without an ACL: the owner through their private group, or root only."""
    if not name:
        return Readers(0, ROOT_ONLY_MODE, "the job names no owner")
    try:
        pw = pwd.getpwnam(name)
    except (KeyError, UnicodeEncodeError):
        return Readers(0, ROOT_ONLY_MODE, f"owner {name!r} is not known on this host")
    try:
        group = grp.getgrgid(pw.pw_gid)
    except KeyError:
        return Readers(0, ROOT_ONLY_MODE, f"the primary group {pw.pw_gid} of owner {name!r} "
                                          "is not known on this host")
    # a group named after the user with no other members is theirs alone; any other
    # would let its members read the trace (fellow members of "users", say)
    if group.gr_name != name or not set(group.gr_mem) <= {name}:
        return Readers(0, ROOT_ONLY_MODE, f"the primary group {group.gr_name!r} of owner "
                                          f"{name!r} is not theirs alone")
    return Readers(pw.pw_gid, FILE_MODE)


def _make_parents(directory: Path) -> None:
    """Make the missing directories above a file directory, 0755 whatever the umask
    (a hardened node's 077 would keep owners out of their own files)."""
    missing = []
    while not os.path.lexists(directory) and directory != directory.parent:
        missing.append(directory)
        directory = directory.parent
    for path in reversed(missing):
        try:
            path.mkdir(mode=DIR_MODE)
        except FileExistsError:
            continue
        os.chmod(path, DIR_MODE)


def open_dir(directory: Path) -> int:
    """Open a directory of such files (made on demand by root) and check nobody else
    controls it; raise :class:`Refused` when it cannot be used."""
    made = False
    if os.geteuid() == 0 and not os.path.lexists(directory):
        _make_parents(directory.parent)
        with contextlib.suppress(FileExistsError):  # another hook made it meanwhile
            directory.mkdir(mode=DIR_MODE)
            made = True
    try:
        dfd = os.open(directory, DIR_FLAGS)
    except OSError as exc:
        # with O_DIRECTORY, Linux reports a symlink as ENOTDIR, not ELOOP
        if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and directory.is_symlink()):
            raise Refused(f"{directory} is a symbolic link") from exc
        if exc.errno == errno.ENOTDIR:
            raise Refused(f"{directory} is not a directory") from exc
        raise Refused(f"cannot open {directory}: {exc.strerror}") from exc
    try:
        st = os.fstat(dfd)
        # a user who owns or can write the directory could swap the file for a link
        # to any file root then appends to, or read another job's trace
        if st.st_uid != 0:
            raise Refused(f"{directory} must be owned by root, got uid {st.st_uid}")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise Refused(f"{directory} must not be writable by group or others, got mode "
                           f"{stat.S_IMODE(st.st_mode):04o}")
        if made and stat.S_IMODE(st.st_mode) != DIR_MODE:
            os.fchmod(dfd, DIR_MODE)  # the umask took bits away; through the fd, not the name
    except BaseException:
        os.close(dfd)
        raise
    return dfd


def open_in(dfd: int, name: str, owner: Readers, display: Path, flags: int) -> int:
    """Open ``name`` in the directory ``dfd`` with ``flags`` (O_CREAT among them; O_NOFOLLOW
    and O_CLOEXEC are added): root's, group and mode ``owner``'s.

    Only root writes these files; a file found with another user or group (an earlier
    geco's owner-owned file, or an earlier job with the same id and another owner: ids
    restart) is replaced, never handed over.
    """
    flags |= os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(2):
        created = False
        try:
            try:
                fd = os.open(name, flags | os.O_EXCL, ROOT_ONLY_MODE, dir_fd=dfd)
                created = True
            except FileExistsError:
                fd = os.open(name, flags, ROOT_ONLY_MODE, dir_fd=dfd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise Refused(f"{display} is a symbolic link") from exc
            if exc.errno == errno.ENXIO:
                raise Refused(f"{display} is not a regular file") from exc
            raise Refused(f"cannot open {display}: {exc.strerror}") from exc
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            os.close(fd)
            what = "a regular file" if not stat.S_ISREG(st.st_mode) else "a file with one link"
            raise Refused(f"{display} is not {what}")
        if not created and (st.st_uid, st.st_gid) != (0, owner.gid):
            os.close(fd)
            os.unlink(name, dir_fd=dfd)
            continue
        if st.st_gid != owner.gid:
            os.fchown(fd, 0, owner.gid)
        if stat.S_IMODE(st.st_mode) != owner.mode:
            os.fchmod(fd, owner.mode)
        if owner.acl:
            _set_acl(fd, owner.acl, display)
        return fd
    raise Refused(f"{display} keeps being replaced")


def _set_acl(fd: int, acl: bytes, display: Path) -> None:
    """Give the file ``acl`` (unless it has it); a file system without ACLs keeps the file
    to its owner and root (fewer readers, never more), said once."""
    try:
        if os.getxattr(fd, _ACL_XATTR) == acl:
            return
    except OSError:
        pass  # none yet (ENODATA), or no ACLs here: setting it says which
    try:
        os.setxattr(fd, _ACL_XATTR, acl)
    except OSError as exc:
        # the mode's group bits would otherwise let the file's group read it
        os.fchmod(fd, FILE_MODE if os.fstat(fd).st_gid else ROOT_ONLY_MODE)
        if display.parent not in _NO_ACLS:
            _NO_ACLS.add(display.parent)
            _log.warning("%s: cannot give the readers [usage] readers names an ACL (%s): "
                         "only root and the job's owner read the files there", display.parent,
                         exc.strerror)


_NO_ACLS: set[Path] = set()
