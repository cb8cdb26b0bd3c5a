"""The sandbox's child process: confine itself, then run the code read from stdin.

Run as `python -I child.py FOLDER LIMITS_JSON STATUS_FD` by rlboost.environments.sandbox.runner,
never imported. It uses the standard library plus the `landlock` and `pyseccomp` packages,
all imported before any restriction. In order: resource limits (address space, CPU time,
file size, open files, no core dumps); a network namespace of its own (no interface but a
loopback that is down); no new privileges; Landlock (read and execute only under the
interpreter's folders, read and write only under FOLDER); seccomp (no IPv4, IPv6, packet or
netlink sockets, no ptrace, mounts, namespaces, keyrings, BPF). Each layer it applied goes
to STATUS_FD as JSON before the code runs; with require set, a layer it cannot apply ends
the child with the exit code limits["exit_unconfined"] before any of the code runs; code
that runs out of memory ends it with limits["exit_memory"].
"""

import ctypes
import errno
import json
import os
import resource
import socket
import sys
import sysconfig
import traceback

try:  # imported before any restriction: loading them reads files (and runs ldconfig) outside the folder
    import landlock
except ImportError:
    landlock = None
try:
    import pyseccomp as seccomp
except (ImportError, OSError):  # OSError: the package without the libseccomp it loads
    seccomp = None

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
DENIED_FAMILIES = (socket.AF_INET, socket.AF_INET6, socket.AF_PACKET, socket.AF_NETLINK)
DENIED_CALLS = ("ptrace", "process_vm_readv", "process_vm_writev", "mount", "umount2", "pivot_root", "chroot",
                "unshare", "setns", "keyctl", "add_key", "request_key", "bpf", "perf_event_open",
                "io_uring_setup")
MiB = 1 << 20


def set_limits(limits: dict) -> None:
    memory = limits["memory_mb"] * MiB
    cpu = limits["cpu_s"]
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_mb"] * MiB,) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def leave_network() -> str:
    """A network namespace of its own; as an unprivileged user, inside a user namespace."""
    libc = ctypes.CDLL(None, use_errno=True)
    flags = CLONE_NEWNET if os.geteuid() == 0 else CLONE_NEWUSER | CLONE_NEWNET
    if libc.unshare(flags) != 0:
        raise OSError(ctypes.get_errno(), f"unshare: {os.strerror(ctypes.get_errno())}")
    return "network namespace"


def confine_files(folder: str) -> str:
    if landlock is None:
        raise ImportError("the landlock package is not installed")
    ruleset = landlock.Ruleset()
    read = landlock.FSAccess.READ_FILE | landlock.FSAccess.READ_DIR | landlock.FSAccess.EXECUTE
    paths = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    paths |= {os.path.dirname(os.path.realpath(sys.executable)), sys.base_prefix, sys.prefix}
    ruleset.allow(*sorted(p for p in paths if os.path.isdir(p)), rules=read)
    ruleset.allow(folder)
    ruleset.apply()
    return f"landlock (abi {landlock.landlock_abi_version()})"


def filter_calls() -> str:
    if seccomp is None:
        raise ImportError("the pyseccomp package (or libseccomp) is not installed")
    f = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    for family in DENIED_FAMILIES:
        f.add_rule(seccomp.ERRNO(errno.EACCES), "socket", seccomp.Arg(0, seccomp.EQ, family))
    for name in DENIED_CALLS:
        f.add_rule(seccomp.ERRNO(errno.EPERM), name)
    f.load()
    return "seccomp"


def confine(folder: str, limits: dict, status_fd: int) -> None:
    applied, missing = ["resource limits"], []
    set_limits(limits)
    for layer in (leave_network, lambda: confine_files(folder), filter_calls):
        try:
            applied.append(layer())
        except Exception as e:  # a kernel or a package without it: reported, then required or not
            missing.append(f"{type(e).__name__}: {' '.join(str(e).split())[:120]}")
    with os.fdopen(status_fd, "w") as status:
        json.dump({"applied": applied, "missing": missing}, status)
    if missing and limits["require"]:
        os._exit(limits["exit_unconfined"])


def main() -> None:
    folder, limits, status_fd = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    code = sys.stdin.read()
    os.chdir(folder)
    confine(folder, limits, status_fd)
    sys.argv = ["main.py"]
    try:
        exec(compile(code, "main.py", "exec"), {"__name__": "__main__"})
    except MemoryError:
        os._exit(limits["exit_memory"])
    except SystemExit:
        raise
    except BaseException:
        lines = traceback.format_exc().splitlines()
        sys.stderr.write("\n".join(lines[-8:]) + "\n")
        sys.stderr.flush()
        os._exit(1)


if __name__ == "__main__":
    main()
