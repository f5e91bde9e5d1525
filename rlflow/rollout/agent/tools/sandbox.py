"""The python tool's sandbox: a script that isolates itself, then runs the model's program.

``python_tool.py`` starts it as ``python -I -S -B sandbox.py CONFIG`` in a fresh temporary directory that
holds the program as ``main.py``. CONFIG is JSON: ``status_fd`` (the write end of the status pipe),
``parent_pid`` (the tool's process), ``rlimits`` (``{"RLIMIT_CPU": [soft, hard], ...}``) and
``allow_unisolated``. Three processes take part, each SIGKILLed when its parent dies:

1. this script enters new user, network and PID namespaces (``unshare``), then forks;
2. its child is PID 1 of the new PID namespace: it forks the program, waits for it and reports how it
   ended; when it exits, the kernel kills whatever the program left running in the namespace;
3. the program sets its resource limits, ``PR_SET_NO_NEW_PRIVS``, a Landlock domain (read and execute
   everywhere, write only under the working directory and to /dev/null, no TCP, no signals or abstract
   unix sockets to processes outside the domain) and a seccomp filter (no unix sockets, no io_uring),
   then execs ``python -I -S -B main.py``.

Each process reports on the status pipe, one JSON object per line: ``{"isolation": [...], "missing":
[...]}`` (what it applied, what it could not), ``{"refused": message}`` (a required mechanism is missing
and ``allow_unisolated`` is false: nothing ran), ``{"failed": message}`` (the sandbox itself broke) and
``{"exit": code}`` or ``{"signal": number}`` with ``"cpu_s"`` (how the program ended).

Filesystem isolation (Landlock) and network isolation (the network namespace, else Landlock's TCP rules)
are required; the seccomp filter is applied where this file knows the machine's syscall numbers.

This file imports only the standard library: it runs in isolated mode, without rlflow or site-packages.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import resource
import select
import signal
import sys
from typing import Any, Callable, NoReturn

LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.syscall.restype = ctypes.c_long
ALLOW_UNISOLATED_KEY = "rollout.multi_turn.tool_options.python.allow_unisolated"
PROGRAM_NOT_STARTED = 125

PR_SET_PDEATHSIG, PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS = 1, 22, 38
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000

# Landlock (linux/landlock.h). Its syscalls have the same numbers on every architecture.
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_MAKE_CHAR, FS_MAKE_BLOCK, FS_TRUNCATE = 1 << 6, 1 << 11, 1 << 14
FS_RIGHTS_ADDED = {1: (1 << 13) - 1, 2: 1 << 13, 3: 1 << 14, 5: 1 << 15}  # ABI version -> the rights it adds
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6

# seccomp: machine -> (AUDIT_ARCH_*, the number of socket(2)); io_uring_setup(2) is 425 everywhere.
SECCOMP_ARCHES = {"x86_64": (0xC000003E, 41), "aarch64": (0xC00000B7, 198)}
SYS_IO_URING_SETUP = 425
X32_SYSCALL_BIT = 0x40000000
AF_UNIX = 1
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JGE_K, BPF_RET_K = 0x20, 0x15, 0x35, 0x06


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


class Status:
    """The status pipe: one JSON object per line."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        os.set_inheritable(fd, False)  # closed when the program execs

    def send(self, **fields: Any) -> None:
        os.write(self.fd, (json.dumps(fields) + "\n").encode())


def _checked(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


def _reason(error: OSError) -> str:
    return f"{error.strerror}: {error.filename}" if error.filename else str(error.strerror)


def landlock_abi() -> tuple[int, str]:
    """The kernel's Landlock ABI version (0 without Landlock) and, when 0, why."""
    abi = LIBC.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                       ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    if abi > 0:
        return abi, ""
    reasons = {errno.ENOSYS: "the kernel has no Landlock (Linux >= 5.13 built with CONFIG_SECURITY_LANDLOCK)",
               errno.EOPNOTSUPP: "Landlock is disabled: add 'landlock' to the kernel's lsm= boot parameter"}
    code = ctypes.get_errno()
    return 0, reasons.get(code, f"landlock_create_ruleset: {os.strerror(code)}")


def enter_namespaces() -> list[str]:
    """New user, network and PID namespaces; this process keeps its uid and gid (mapped to themselves)."""
    uid, gid = os.getuid(), os.getgid()
    _checked(LIBC.unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID), "unshare(user, network, pid)")
    for path, text in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map", f"{uid} {uid} 1"),
                       ("/proc/self/gid_map", f"{gid} {gid} 1")):
        with open(path, "w") as file:
            file.write(text)
    return ["user-namespace", "network-namespace", "pid-namespace"]


def restrict_with_landlock(workdir: str, abi: int) -> list[str]:
    """Read and execute everywhere, write only under ``workdir`` (and /dev/null); no TCP from ABI 4 on;
    no signals or abstract unix sockets out of the domain from ABI 6 on."""
    fs = sum(rights for version, rights in FS_RIGHTS_ADDED.items() if version <= abi)
    attr = _RulesetAttr(handled_access_fs=fs,
                        handled_access_net=(NET_BIND_TCP | NET_CONNECT_TCP) if abi >= 4 else 0,
                        scoped=(SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if abi >= 6 else 0)
    ruleset = _checked(LIBC.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr),
                                    ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0)),
                       "landlock_create_ruleset")
    try:
        rules = ((os.sep, FS_EXECUTE | FS_READ_FILE | FS_READ_DIR),
                 (workdir, fs & ~(FS_MAKE_CHAR | FS_MAKE_BLOCK)),
                 (os.devnull, (FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE) & fs))
        for path, rights in rules:
            _allow_beneath(ruleset, path, rights)
        _checked(LIBC.syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)),
                 "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return ["landlock-filesystem"] + ["landlock-tcp"] * (abi >= 4) + ["landlock-scope"] * (abi >= 6)


def _allow_beneath(ruleset: int, path: str, rights: int) -> None:
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        rule = _PathBeneathAttr(allowed_access=rights, parent_fd=fd)
        _checked(LIBC.syscall(SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH),
                              ctypes.byref(rule), ctypes.c_uint32(0)), f"landlock_add_rule({path})")
    finally:
        os.close(fd)


def deny_unix_sockets() -> list[str]:
    """A seccomp filter: socket(AF_UNIX, ...), io_uring_setup and foreign-ABI syscalls fail with EACCES.

    Landlock does not cover connecting to a unix socket file (a Docker or Ray socket) and the network
    namespace does not either; io_uring could create sockets without socket(2).
    """
    if platform.machine() not in SECCOMP_ARCHES:
        raise OSError(errno.ENOTSUP, f"no seccomp syscall table for {platform.machine()}")
    arch, sys_socket = SECCOMP_ARCHES[platform.machine()]
    allow, deny = 8, 9  # the indices of the two return instructions below
    program = [
        (BPF_LD_W_ABS, 0, 0, 4),                         # 0: seccomp_data.arch
        (BPF_JEQ_K, 0, deny - 2, arch),                  # 1: another ABI (i386, x32 below): deny
        (BPF_LD_W_ABS, 0, 0, 0),                         # 2: seccomp_data.nr
        (BPF_JGE_K, deny - 4, 0, X32_SYSCALL_BIT),       # 3
        (BPF_JEQ_K, deny - 5, 0, SYS_IO_URING_SETUP),    # 4
        (BPF_JEQ_K, 0, allow - 6, sys_socket),           # 5: not socket(2): allow
        (BPF_LD_W_ABS, 0, 0, 16),                        # 6: seccomp_data.args[0] (low half): the family
        (BPF_JEQ_K, deny - 8, allow - 8, AF_UNIX),       # 7
        (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),            # 8: allow
        (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.EACCES),  # 9: deny
    ]
    filters = (_SockFilter * len(program))(*(_SockFilter(*instruction) for instruction in program))
    fprog = _SockFprog(len(program), filters)
    _checked(LIBC.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(fprog),
                        ctypes.c_ulong(0), ctypes.c_ulong(0)), "prctl(PR_SET_SECCOMP)")
    return ["seccomp-no-unix-sockets"]


def set_limits(limits: dict[str, list[int]]) -> list[str]:
    """``setrlimit`` for each ``RLIMIT_*`` name, never above a hard limit already in place."""
    for name, (soft, hard) in limits.items():
        kind = getattr(resource, name)
        current_hard = resource.getrlimit(kind)[1]
        if current_hard != resource.RLIM_INFINITY:
            hard = min(hard, current_hard)
        resource.setrlimit(kind, (min(soft, hard), hard))
    return ["rlimits"]


def refusal(missing: list[str]) -> str:
    """The message of a refused run: what is missing, and the two ways on."""
    return (f"the python tool needs {'; and '.join(missing)}. Nothing ran. Run the rollout where the kernel "
            f"allows them, or set {ALLOW_UNISOLATED_KEY}=true to run code without them")


def die_with_parent(parent_gone: Callable[[], bool]) -> None:
    """SIGKILL this process when its parent exits; exit now if ``parent_gone()`` says it already has."""
    _checked(LIBC.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL)), "prctl(PR_SET_PDEATHSIG)")
    if parent_gone():
        os._exit(1)


def run_program(config: dict[str, Any], status: Status, abi: int, supervisor: int) -> NoReturn:
    """Limit and isolate this process, then exec the program; never returns."""
    try:
        die_with_parent(lambda: os.getppid() != supervisor)
        applied = set_limits(config["rlimits"])
        _checked(LIBC.prctl(PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0),
                            ctypes.c_ulong(0)), "prctl(PR_SET_NO_NEW_PRIVS)")
        applied.append("no-new-privs")
        missing = []
        try:
            applied += restrict_with_landlock(os.getcwd(), abi) if abi else []
        except OSError as error:
            missing.append(f"filesystem isolation (Landlock failed: {_reason(error)})")
            if not config["allow_unisolated"]:
                status.send(refused=refusal(missing))
                os._exit(PROGRAM_NOT_STARTED)
        try:
            applied += deny_unix_sockets()
        except OSError as error:
            missing.append(f"the unix socket filter ({_reason(error)})")
        status.send(isolation=applied, missing=missing)
        os.execv(sys.executable, [sys.executable, "-I", "-S", "-B", "main.py"])
    except BaseException as error:  # whatever happens here: report it, and never run the code
        status.send(failed=f"{type(error).__name__}: {error}")
        os._exit(PROGRAM_NOT_STARTED)


def supervise(config: dict[str, Any], status: Status, abi: int) -> NoReturn:
    """PID 1 of the namespace: run the program, reap every orphan, report how the program ended."""
    supervisor = os.getpid()
    program = os.fork()
    if program == 0:
        run_program(config, status, abi, supervisor)
    while True:
        pid, wait_status, usage = os.wait4(-1, 0)
        if pid == program:
            break
    ended = ({"signal": os.WTERMSIG(wait_status)} if os.WIFSIGNALED(wait_status)
             else {"exit": os.WEXITSTATUS(wait_status)})
    status.send(cpu_s=round(usage.ru_utime + usage.ru_stime, 3), **ended)
    os._exit(0)


def main(argv: list[str]) -> None:
    """Enter the namespaces, refuse when a required mechanism is missing, else run the program under PID 1."""
    config = json.loads(argv[1])
    status = Status(config["status_fd"])
    abi, no_landlock = landlock_abi()
    try:
        isolation, no_namespaces = enter_namespaces(), ""
    except OSError as error:
        isolation, no_namespaces = [], _reason(error)
    required = []
    if no_namespaces and abi < 4:
        required.append(f"network isolation: a network namespace ({no_namespaces}) or Landlock ABI >= 4 for TCP "
                        f"(this kernel: {abi or 'none'})")
    if not abi:
        required.append(f"filesystem isolation: Landlock ({no_landlock})")
    if required and not config["allow_unisolated"]:
        status.send(refused=refusal(required))
        return
    missing = [f"user, network and PID namespaces ({no_namespaces})"] * bool(no_namespaces)
    status.send(isolation=isolation, missing=missing + [f"Landlock ({no_landlock})"] * (not abi))
    die_with_parent(lambda: os.getppid() != config["parent_pid"])  # the tool's process
    watchdog_read, watchdog_write = os.pipe()
    init = os.fork()
    if init == 0:
        os.close(watchdog_write)
        die_with_parent(lambda: bool(select.select([watchdog_read], [], [], 0)[0]))  # end of file: this script died
        os.close(watchdog_read)
        supervise(config, status, abi)
    os.close(watchdog_read)
    os.waitpid(init, 0)


if __name__ == "__main__":
    main(sys.argv)
