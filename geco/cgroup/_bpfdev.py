"""Deny devices to a cgroup v2 with a BPF device program, from plain Python.

cgroup v2 has no ``devices.deny`` file: the kernel asks a BPF program of type
``BPF_PROG_TYPE_CGROUP_DEVICE`` attached to the cgroup (or an ancestor) on each
open(2) and mknod(2) of a device node. This module assembles that program by
hand (no compiler, no libbpf) and loads and attaches it with the bpf(2) syscall
through ctypes.

The program's context is ``struct bpf_cgroup_dev_ctx { u32 access_type; u32
major; u32 minor; }``, where ``access_type`` is ``access << 16 | type`` (type 1
block, 2 char). It returns 1 to allow, 0 to refuse (the caller gets EPERM)::

    r2 = ctx->access_type & 0xffff      ; device type
    r4 = ctx->major
    r5 = ctx->minor
    ; one rule per denied minor, or run of minors, of a (type, major):
    if r2 != type  goto next_rule
    if r4 != major goto next_rule
    if r5 != minor goto next_rule       ; one minor; a run tests its ends instead:
                                        ;   if r5 < first goto next_rule
                                        ;   if r5 > last  goto next_rule
                                        ; every minor of the major: no test at all
    r0 = 0 ; exit                       ; deny, whatever the access
    ; after the last rule:
    r0 = 1 ; exit                       ; every other device is allowed

Denied minors are merged into runs first: a GPU's MIG capability devices are a run of
135 minors, and the verifier's time grows with the program (one rule each would make a
job granted one of eight GPUs a program of some 950 rules).

It is attached with ``BPF_F_ALLOW_MULTI``: the programs that systemd or a
parent cgroup attached stay in force beside this one and every one of them must
allow an access, so this program only ever narrows what the cgroup may use
(without the flag, the attach would fail where a parent has an overridable
program, or replace another one). The program fd is closed after attaching: the
attachment holds the program for as long as the cgroup exists, and the job's
rmdir of its cgroup removes both.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import resource
import struct
from collections.abc import Sequence
from pathlib import Path

from geco.cgroup._fs import cgroup_error

__all__ = ["deny_devices"]

_SYS_BPF = {"x86_64": 321, "aarch64": 280}
_BPF_PROG_LOAD = 5
_BPF_PROG_ATTACH = 8
_BPF_PROG_TYPE_CGROUP_DEVICE = 15
_BPF_CGROUP_DEVICE = 6
_BPF_F_ALLOW_MULTI = 2
_DEV_TYPE = {"b": 1, "c": 2}  # BPF_DEVCG_DEV_BLOCK, BPF_DEVCG_DEV_CHAR
_ATTR_SIZE = 128  # a prefix of union bpf_attr, zero-filled; the kernel zero-extends it
_LOG_SIZE = 1 << 16
_LICENSE = b"GPL\0"

# -- hand assembly: struct bpf_insn { u8 code; u8 dst:4, src:4; s16 off; s32 imm; } --

_R0, _R1, _R2, _R4, _R5 = 0, 1, 2, 4, 5
_CTX_ACCESS_TYPE, _CTX_MAJOR, _CTX_MINOR = 0, 4, 8  # offsets in bpf_cgroup_dev_ctx


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, src << 4 | dst, off, imm)


def _mov_imm(dst: int, imm: int) -> bytes:
    return _insn(0xB7, dst, imm=imm)  # BPF_ALU64 | BPF_MOV | BPF_K


def _ldx_w(dst: int, src: int, off: int) -> bytes:
    return _insn(0x61, dst, src, off)  # BPF_LDX | BPF_W | BPF_MEM: dst = *(u32 *)(src + off)


def _and_imm(dst: int, imm: int) -> bytes:
    return _insn(0x54, dst, imm=imm)  # BPF_ALU | BPF_AND | BPF_K (32 bits)


def _jne_imm(dst: int, imm: int, off: int) -> bytes:
    return _insn(0x55, dst, off=off, imm=imm)  # BPF_JMP | BPF_JNE | BPF_K: skip off insns


def _jlt_imm(dst: int, imm: int, off: int) -> bytes:
    return _insn(0xA5, dst, off=off, imm=imm)  # BPF_JMP | BPF_JLT | BPF_K (unsigned)


def _jgt_imm(dst: int, imm: int, off: int) -> bytes:
    return _insn(0x25, dst, off=off, imm=imm)  # BPF_JMP | BPF_JGT | BPF_K (unsigned)


def _exit() -> bytes:
    return _insn(0x95)  # BPF_JMP | BPF_EXIT


def _runs(devices: Sequence[tuple[str, int, int | None]]
          ) -> list[tuple[int, int, tuple[int, int] | None]]:
    """``(type, major, (first, last))`` per run of consecutive denied minors of a device
    type and major, ``(type, major, None)`` where every minor is denied; sorted."""
    minors: dict[tuple[int, int], set[int] | None] = {}
    for kind, major, minor in devices:
        if kind not in _DEV_TYPE or not 0 <= major < 1 << 12 \
                or (minor is not None and not 0 <= minor < 1 << 20):
            raise ValueError("not a device (type c or b, major, minor or None): "
                             f"{(kind, major, minor)}")
        where = (_DEV_TYPE[kind], major)
        have = minors.setdefault(where, set())
        if minor is None:
            minors[where] = None
        elif have is not None:
            have.add(minor)
    runs: list[tuple[int, int, tuple[int, int] | None]] = []
    for (kind_, major), have in sorted(minors.items()):
        if have is None:
            runs.append((kind_, major, None))
            continue
        ordered = sorted(have)
        first = prev = ordered[0]
        for minor in ordered[1:]:
            if minor != prev + 1:
                runs.append((kind_, major, (first, prev)))
                first = minor
            prev = minor
        runs.append((kind_, major, (first, prev)))
    return runs


def _program(devices: Sequence[tuple[str, int, int | None]]) -> bytes:
    """The instructions: the context loads, one rule per run of denied minors, accept."""
    code = [_ldx_w(_R2, _R1, _CTX_ACCESS_TYPE), _and_imm(_R2, 0xFFFF),
            _ldx_w(_R4, _R1, _CTX_MAJOR), _ldx_w(_R5, _R1, _CTX_MINOR)]
    for kind, major, run in _runs(devices):
        checks = [(_jne_imm, _R2, kind), (_jne_imm, _R4, major)]
        if run is not None and run[0] == run[1]:
            checks.append((_jne_imm, _R5, run[0]))
        elif run is not None:
            checks += [(_jlt_imm, _R5, run[0]), (_jgt_imm, _R5, run[1])]
        # a failed check skips the checks after it and "r0 = 0; exit": the next rule
        code += [jump(reg, imm, len(checks) - i + 1) for i, (jump, reg, imm) in enumerate(checks)]
        code += [_mov_imm(_R0, 0), _exit()]
    return b"".join([*code, _mov_imm(_R0, 1), _exit()])


# -- the bpf(2) syscall ------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_syscall.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint]


def _bpf(cmd: int, attr: ctypes.Array[ctypes.c_char]) -> int:
    """bpf(cmd, attr): the result (an fd or 0), or the errno negated."""
    number = _SYS_BPF.get(platform.machine())
    if number is None:
        return -errno.ENOSYS
    result = int(_syscall(number, cmd, ctypes.addressof(attr), _ATTR_SIZE))
    return result if result >= 0 else -ctypes.get_errno()


def _load(insns: bytes, log: ctypes.Array[ctypes.c_char] | None) -> int:
    """BPF_PROG_LOAD of the device program; the prog fd or the errno negated."""
    code = ctypes.create_string_buffer(insns, len(insns))
    license_ = ctypes.create_string_buffer(_LICENSE, len(_LICENSE))
    attr = ctypes.create_string_buffer(_ATTR_SIZE)
    # prog_type, insn_cnt, insns, license, log_level, log_size, log_buf, kern_version,
    # prog_flags, prog_name[16]
    struct.pack_into("<IIQQIIQII16s", attr, 0, _BPF_PROG_TYPE_CGROUP_DEVICE, len(insns) // 8,
                     ctypes.addressof(code), ctypes.addressof(license_),
                     1 if log is not None else 0, _LOG_SIZE if log is not None else 0,
                     ctypes.addressof(log) if log is not None else 0, 0, 0, b"geco_devices")
    return _bpf(_BPF_PROG_LOAD, attr)


def _load_program(insns: bytes, cgroup_dir: Path) -> int:
    """The loaded program's fd; CgroupError naming why the kernel refused it."""
    fd = _load(insns, None)
    if fd == -errno.EPERM:  # kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK
        try:
            resource.setrlimit(resource.RLIMIT_MEMLOCK,
                               (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        except (ValueError, OSError):
            pass  # not allowed to: the EPERM below says so
        else:
            fd = _load(insns, None)
    if fd >= 0:
        return fd
    err, hint = -fd, ""
    if err in (errno.EACCES, errno.EINVAL):  # load again to get the verifier's words
        log = ctypes.create_string_buffer(_LOG_SIZE)
        fd = _load(insns, log)
        if fd >= 0:  # a transient refusal: take it
            return fd
        words = [line for line in log.value.decode("utf-8", "replace").strip().splitlines()
                 if not line.startswith("processed ")]  # the verifier's statistics
        hint = f"verifier: {' / '.join(words[-3:])}" if words else ""
    if err == errno.EINVAL and not hint:
        hint = "this kernel has no BPF cgroup device programs (CONFIG_CGROUP_BPF)"
    elif err == errno.EPERM:
        hint = "needs root (CAP_SYS_ADMIN, or CAP_BPF)"
    elif err == errno.ENOSYS:
        hint = f"no bpf(2) syscall here ({platform.machine()})"
    raise cgroup_error("cannot load the BPF device program", OSError(err, os.strerror(err)),
                       hint=hint, path=cgroup_dir)


def deny_devices(cgroup_dir: Path, devices: Sequence[tuple[str, int, int | None]]) -> None:
    """Attach to cgroup_dir a device program that refuses (EPERM) open/mknod of each
    (type, major, minor) in devices, type "c" or "b", minor None for every minor of the
    major, and accepts every other device.

    devices empty: attach nothing.

    Raises
    ------
    CgroupError
        naming the cgroup dir and the errno: the dir cannot be opened (ENOENT), the
        kernel has no BPF device programs (EINVAL), the caller is not root (EPERM), the
        dir is not on a cgroup2 (EBADF) ...
    ValueError
        when a device is not ("c" or "b", major < 4096, minor < 2**20 or None).
    """
    if not devices:
        return
    insns = _program(devices)
    try:
        dir_fd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise cgroup_error("cannot open the cgroup", exc, path=cgroup_dir) from exc
    try:
        prog_fd = _load_program(insns, cgroup_dir)
        try:
            attr = ctypes.create_string_buffer(_ATTR_SIZE)
            # target_fd, attach_bpf_fd, attach_type, attach_flags
            struct.pack_into("<IIII", attr, 0, dir_fd, prog_fd, _BPF_CGROUP_DEVICE,
                             _BPF_F_ALLOW_MULTI)
            result = _bpf(_BPF_PROG_ATTACH, attr)
        finally:
            os.close(prog_fd)  # the attachment keeps the program
    finally:
        os.close(dir_fd)
    if result < 0:
        hint = "not a cgroup2 directory" if -result == errno.EBADF else ""
        raise cgroup_error("cannot attach the BPF device program",
                           OSError(-result, os.strerror(-result)), hint=hint, path=cgroup_dir)
