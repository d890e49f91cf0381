"""What a job's account can leave in the kernel rather than on disk: keys, System V IPC objects and POSIX
message queues; found, removed, and looked for again.

None of them is a file under the scanned file systems, and each outlives the processes that made it:

- keys: the account's user keyring (`@u`), user session keyring (`@us`) and persistent keyring live
  as long as the uid has keys, whatever process is left (keyrings(7), user-keyring(7),
  persistent-keyring(7)); a key added to one is read by the next job of the same account. Root cannot
  see them (/proc/keys lists only the keys its reader may view, proc(5)), so the clearing and the
  check run in a child process that takes the account's uid: KEYCTL_CLEAR needs only write permission
  on the keyring, which its owner has (keyctl_clear(3)).
- System V shared memory, message queues and semaphore sets, listed with their owner and creator uid
  in /proc/sysvipc/{shm,msg,sem} (proc(5)) and removed by root with IPC_RMID (shmctl(2), msgctl(2),
  semctl(2)).
- POSIX message queues, files of the mqueue file system, normally mounted at /dev/mqueue
  (mq_overview(7)); unlinking one there is mq_unlink(3). POSIX shared memory is files in /dev/shm,
  which the scrub cleans as a temporary directory.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import platform
import pwd
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SYSVIPC_KINDS = {"shm": "shmid", "msg": "msqid", "sem": "semid"}
"""/proc/sysvipc's files and the column that names an object's id in each (proc(5))."""
_IPC_RMID = 0
_KEY_SPEC_USER_KEYRING = -4
_KEY_SPEC_USER_SESSION_KEYRING = -5
_KEYCTL_GET_KEYRING_ID = 0
_KEYCTL_CLEAR = 7
_KEYCTL_GET_PERSISTENT = 22
_KEYCTL_SYSCALL = {"x86_64": 250, "aarch64": 219}
"""keyctl(2)'s number on the architectures instances run (the kernel's syscall tables; glibc has no
wrapper, libkeyutils is not installed)."""
_NO_KEYS = frozenset({errno.ENOSYS, errno.EPERM})
"""keyctl(2)'s answer where there are no keys to use: a kernel without them (ENOSYS), or a seccomp filter
that refuses the call (EPERM: Docker's default profile does), for the job as for the agent."""
_KEY_GC_SECONDS = 2.0
"""Unlinked keys are destroyed by the kernel's key garbage collector, shortly after: the check waits
this long for them to go before it names them."""
_KEY_POLL_SECONDS = 0.02

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class KernelObjectError(OSError):
    """An object could not be removed or the kernel could not be asked."""


def sysv_ipc_of(uid: int, root: Path = Path("/proc/sysvipc")) -> list[str]:
    """The System V IPC objects `uid` owns or created, as `shm 12`, `msg 3`, `sem 7`."""
    found = []
    for kind, id_column in SYSVIPC_KINDS.items():
        try:
            header, *rows = (root / kind).read_text().splitlines()
        except FileNotFoundError:
            continue
        columns = header.split()
        for row in rows:
            values = dict(zip(columns, row.split(), strict=False))
            if str(uid) in (values.get("uid"), values.get("cuid")):
                found.append(f"{kind} {values[id_column]}")
    return found


def remove_sysv_ipc(objects: list[str]) -> None:
    """IPC_RMID on each object `sysv_ipc_of` named; an attached segment goes once detached (shmctl(2))."""
    remove: dict[str, Callable[[int], int]] = {
        "shm": lambda ipc_id: _libc.shmctl(ipc_id, _IPC_RMID, None),
        "msg": lambda ipc_id: _libc.msgctl(ipc_id, _IPC_RMID, None),
        "sem": lambda ipc_id: _libc.semctl(ipc_id, 0, _IPC_RMID),
    }
    failed = []
    for name in objects:
        kind, ipc_id = name.split()
        if remove[kind](int(ipc_id)) != 0 and ctypes.get_errno() not in (22, 43):  # EINVAL, EIDRM: gone
            failed.append(f"{name} ({os.strerror(ctypes.get_errno())})")
    if failed:
        raise KernelObjectError(f"System V IPC objects could not be removed: {', '.join(failed)}")


def message_queues_of(uid: int, mqueue_dir: Path) -> list[Path]:
    """The POSIX message queues `uid` owns; none where no mqueue file system is mounted at `mqueue_dir`."""
    if not mqueue_dir.is_dir():
        return []
    return sorted(Path(e.path) for e in os.scandir(mqueue_dir) if e.stat(follow_symlinks=False).st_uid == uid)


def remove_message_queues(uid: int, mqueue_dir: Path) -> None:
    for queue in message_queues_of(uid, mqueue_dir):
        queue.unlink(missing_ok=True)


def clear_keyrings(account: pwd.struct_passwd) -> None:
    """Empties the account's user, user session and persistent keyrings, as the account."""
    _as_account(account, _clear_keyrings)


def keys_of(account: pwd.struct_passwd) -> list[str]:
    """Each key of the account, but its own keyrings while empty; once the garbage collector has had
    its grace for keys just unlinked. Read as the account."""
    return _as_account(account, _keys_after_collection)


def _clear_keyrings(account: pwd.struct_passwd) -> list[str]:
    keyctl = _keyctl()
    if keyctl(_KEYCTL_GET_KEYRING_ID, _KEY_SPEC_USER_KEYRING, 0) < 0 and ctypes.get_errno() in _NO_KEYS:
        return []
    # The persistent keyring is found by linking it into @us (persistent-keyring(7)); clearing @us
    # after it drops that link again. Negative (EOPNOTSUPP): the kernel has no persistent keyrings.
    persistent = keyctl(_KEYCTL_GET_PERSISTENT, -1, _KEY_SPEC_USER_SESSION_KEYRING)
    keyrings = [persistent] if persistent >= 0 else []
    for keyring in (*keyrings, _KEY_SPEC_USER_KEYRING, _KEY_SPEC_USER_SESSION_KEYRING):
        if keyctl(_KEYCTL_CLEAR, keyring) < 0:
            raise KernelObjectError(
                f"keyring {keyring} could not be cleared: {os.strerror(ctypes.get_errno())}"
            )
    return []


def _keys_after_collection(account: pwd.struct_passwd) -> list[str]:
    deadline = time.monotonic() + _KEY_GC_SECONDS
    while True:
        left = _keys_left(account.pw_uid)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(_KEY_POLL_SECONDS)


def _keys_left(uid: int) -> list[str]:
    """The account's keys in /proc/keys (read as the account) but its own keyrings, empty (keyrings(7):
    `_uid.<uid>`, `_uid_ses.<uid>`, `_persistent.<uid>`)."""
    own_keyrings = {f"_uid.{uid}", f"_uid_ses.{uid}", f"_persistent.{uid}"}
    left = []
    try:
        listing = Path("/proc/keys").read_text()
    except FileNotFoundError:  # a kernel without keys
        return []
    for line in listing.splitlines():
        serial, _flags, _usage, _timeout, _perm, owner, _group, kind, rest = line.split(None, 8)
        description, _, summary = rest.partition(": ")
        if int(owner) != uid:
            continue
        if kind == "keyring" and description in own_keyrings and summary == "empty":
            continue
        left.append(f"{kind} {description} ({serial})")
    return left


def _keyctl() -> Callable[..., int]:
    number = _KEYCTL_SYSCALL.get(platform.machine())
    if number is None:
        raise KernelObjectError(f"no keyctl(2) number known for {platform.machine()}")

    def keyctl(*arguments: int) -> int:
        return int(_libc.syscall(ctypes.c_long(number), *(ctypes.c_long(a) for a in arguments)))

    return keyctl


def _as_account(account: pwd.struct_passwd, work: Callable[[pwd.struct_passwd], list[str]]) -> list[str]:
    """`work(account)` in a forked child that has taken the account's uid and gids; its answer comes back
    over a pipe. The child only makes system calls and exits, as fork in a threaded process allows."""
    reading, writing = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child; its answer is what the parent checks
        status = 0
        try:
            os.close(reading)
            os.setgroups([])
            os.setresgid(account.pw_gid, account.pw_gid, account.pw_gid)
            os.setresuid(account.pw_uid, account.pw_uid, account.pw_uid)
            reply: dict[str, Any] = {"left": work(account)}
        except Exception as exc:  # every failure goes back to the parent, as the reason
            reply = {"error": str(exc)}
        try:
            os.write(writing, json.dumps(reply).encode())
        except OSError:
            status = 1
        os._exit(status)
    os.close(writing)
    with os.fdopen(reading, "rb") as pipe:
        raw = pipe.read()
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    if not raw:
        raise KernelObjectError("the keyring check as the runner account gave no answer")
    answer: dict[str, Any] = json.loads(raw)
    if "error" in answer:
        raise KernelObjectError(answer["error"])
    return [str(item) for item in answer["left"]]
