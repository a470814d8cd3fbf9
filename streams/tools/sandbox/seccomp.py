"""A seccomp filter for sandboxed calls, written as classic BPF (no libseccomp binding needed).

bubblewrap loads it (``--seccomp FD``) in the sandbox after setting no_new_privs. It denies, with EPERM/EACCES
rather than a kill so the snippet sees a clear Python exception:

* ``socket()`` of every family but AF_UNIX (there is no network namespace to reach anyway; this also closes
  netlink and raw packet sockets);
* syscalls that administer the kernel or reach other processes (mount, ptrace, bpf, keyrings, io_uring, ...);
* every syscall of another ABI (x32, i386): the filter checks x86-64 numbers only.

Only x86-64 is covered; elsewhere :func:`filter_bytes` returns None and the sandbox runs without it (namespaces
and rlimits still apply), which the runner logs at start.
"""
from __future__ import annotations

import errno
import platform
import struct

_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_SYSCALL_BIT = 0x40000000
_AF_UNIX = 1
_SYS_SOCKET = 41
# x86-64 numbers: ptrace, mount, umount2, swapon, swapoff, reboot, init_module, delete_module, kexec_load,
# add_key, request_key, keyctl, unshare, perf_event_open, process_vm_readv/writev, setns, finit_module, bpf,
# userfaultfd, io_uring_setup/enter/register, pivot_root, chroot, acct, open_by_handle_at.
_DENIED = (101, 165, 166, 167, 168, 169, 175, 176, 246, 248, 249, 250, 272, 298, 310, 311, 308, 313, 321, 323,
           425, 426, 427, 155, 161, 163, 304)

_LD_ABS_W, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
_RET_ALLOW, _RET_KILL_PROCESS, _RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_OFFSET_NR, _OFFSET_ARCH, _OFFSET_ARG0 = 0, 4, 16


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def filter_bytes() -> bytes | None:
    """The filter as the array of ``struct sock_filter`` bwrap reads, or None on an architecture it does not cover."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    program = [
        _op(_LD_ABS_W, _OFFSET_ARCH),
        _op(_JEQ_K, _AUDIT_ARCH_X86_64, jt=1),  # another ABI's numbers mean other syscalls: kill
        _op(_RET_K, _RET_KILL_PROCESS),
        _op(_LD_ABS_W, _OFFSET_NR),
        _op(_JGE_K, _X32_SYSCALL_BIT, jf=1),
        _op(_RET_K, _RET_ERRNO | errno.EPERM),
        _op(_JEQ_K, _SYS_SOCKET, jf=4),
        _op(_LD_ABS_W, _OFFSET_ARG0),  # the family (low word of args[0], little-endian)
        _op(_JEQ_K, _AF_UNIX, jf=1),
        _op(_RET_K, _RET_ALLOW),
        _op(_RET_K, _RET_ERRNO | errno.EACCES),
    ]
    for number in _DENIED:
        program += [_op(_JEQ_K, number, jf=1), _op(_RET_K, _RET_ERRNO | errno.EPERM)]
    program.append(_op(_RET_K, _RET_ALLOW))
    return b"".join(program)
