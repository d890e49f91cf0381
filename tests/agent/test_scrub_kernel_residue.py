"""What a job leaves outside the scanned file system, planted as the runner account on this kernel: keys in
its keyrings, System V IPC objects, POSIX message queues, files on a tmpfs, files of a subordinate uid;
after the scrub the next job of the account cannot find them, or the instance is refused with the
reason (issue 36, item 1).

Each is planted the way a job's process would plant it, by a process that has become the account
(`InstanceRoot.run_as_account`), through the system calls a job's program makes: add_key(2), shmget(2),
msgget(2), semget(2), mq_open(3). The tests run as root; a tmpfs and the mqueue file system are mounted
into the throwaway root.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import pwd
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import kernel_objects
from agent.kernel_objects import sysv_ipc_of
from agent.scrub import Scrub, build_scrub
from emulator.instance_root import InstanceRoot, MountRefusedError, instance_root, run_job

SUBORDINATE_UID = 100000
"""The first uid useradd gives a user's namespaces by default (login.defs SUB_UID_MIN)."""

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_librt = ctypes.CDLL(ctypes.util.find_library("rt") or None, use_errno=True)
_SYSCALLS = {"x86_64": {"add_key": 248, "keyctl": 250}, "aarch64": {"add_key": 217, "keyctl": 219}}
_KEY_SPEC_USER_KEYRING = -4
_KEY_SPEC_USER_SESSION_KEYRING = -5
_KEYCTL_SEARCH = 10
_KEYCTL_GET_PERSISTENT = 22
_IPC_CREAT = 0o1000
_ENOKEY = 126


@pytest.fixture
def instance() -> Iterator[InstanceRoot]:
    with instance_root() as made:
        yield made


def scrub_of(instance: InstanceRoot) -> Scrub:
    return build_scrub(instance.agent_settings(), docker=lambda: None)


def _syscall(name: str, *arguments: object) -> int:
    number = _SYSCALLS[platform.machine()][name]
    result = int(_libc.syscall(ctypes.c_long(number), *arguments))
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    return result


def add_key(keyring: int, description: str, secret: bytes) -> int:
    """add_key(2): a `user` key holding `secret` in `keyring`; its serial."""
    return _syscall(
        "add_key",
        ctypes.c_char_p(b"user"),
        ctypes.c_char_p(description.encode()),
        ctypes.c_char_p(secret),
        ctypes.c_size_t(len(secret)),
        ctypes.c_long(keyring),
    )


def persistent_keyring() -> int:
    """keyctl_get_persistent(3): the account's persistent keyring, linked into its user session keyring."""
    return _syscall(
        "keyctl",
        ctypes.c_long(_KEYCTL_GET_PERSISTENT),
        ctypes.c_long(-1),
        ctypes.c_long(_KEY_SPEC_USER_SESSION_KEYRING),
    )


def found_key(keyring: int, description: str) -> bool:
    """keyctl_search(3) in `keyring` and every keyring it holds, as the next job would look."""
    try:
        _syscall(
            "keyctl",
            ctypes.c_long(_KEYCTL_SEARCH),
            ctypes.c_long(keyring),
            ctypes.c_char_p(b"user"),
            ctypes.c_char_p(description.encode()),
            ctypes.c_long(0),
        )
    except OSError as exc:
        if exc.errno == _ENOKEY:
            return False
        raise
    return True


def keyrings_refused() -> str | None:
    """Why this machine offers no keyrings (a kernel without them, a seccomp profile refusing keyctl), or None."""
    try:
        _syscall("keyctl", ctypes.c_long(0), ctypes.c_long(_KEY_SPEC_USER_KEYRING), ctypes.c_long(0))
    except OSError as exc:
        return f"keyctl(2) is refused here: {exc}"
    return None


def test_keys_a_job_added_to_the_accounts_keyrings_are_gone_for_the_next_job(instance: InstanceRoot) -> None:
    refused = keyrings_refused()
    if refused:
        pytest.skip(refused)

    # Given a job that added a secret to its user, user session and persistent keyrings, which outlive it
    def plant() -> list[int]:
        return [
            add_key(_KEY_SPEC_USER_KEYRING, "job-secret-user", b"ghs_user"),
            add_key(_KEY_SPEC_USER_SESSION_KEYRING, "job-secret-session", b"ghs_session"),
            add_key(persistent_keyring(), "job-secret-persistent", b"ghs_persistent"),
        ]

    def next_job_finds() -> list[str]:
        keyrings = {
            "job-secret-user": _KEY_SPEC_USER_KEYRING,
            "job-secret-session": _KEY_SPEC_USER_SESSION_KEYRING,
            "job-secret-persistent": persistent_keyring(),
        }
        return [name for name, keyring in keyrings.items() if found_key(keyring, name)]

    instance.run_as_account(plant)
    assert instance.run_as_account(next_job_finds) == [
        "job-secret-user",
        "job-secret-session",
        "job-secret-persistent",
    ]

    # When the scrub runs
    report = scrub_of(instance).run(session_id=None)

    # Then it reports the instance clean, and the next job of the account finds none of them
    assert report.left == []
    assert instance.run_as_account(next_job_finds) == []


def test_system_v_ipc_objects_of_the_account_are_removed(instance: InstanceRoot) -> None:
    # Given a job that made a shared memory segment, a message queue and a semaphore set, and exited
    def plant() -> list[int]:
        return [
            _libc.shmget(0, 4096, _IPC_CREAT | 0o600),
            _libc.msgget(0, _IPC_CREAT | 0o600),
            _libc.semget(0, 1, _IPC_CREAT | 0o600),
        ]

    made = instance.run_as_account(plant)
    assert min(made) >= 0
    uid = instance.account.pw_uid
    assert sorted(name.split()[0] for name in sysv_ipc_of(uid)) == ["msg", "sem", "shm"]

    # When the scrub runs
    report = scrub_of(instance).run(session_id=None)

    # Then it reports the instance clean and the kernel holds no IPC object of the account
    assert report.left == []
    assert sysv_ipc_of(uid) == []


def test_a_posix_message_queue_of_the_account_is_gone_for_the_next_job(instance: InstanceRoot) -> None:
    # Given the mqueue file system where systemd mounts it, and a job that made a queue and exited
    queues = mounted(instance, "mqueue", "dev/mqueue", options="rw")

    def open_queue(flags: int) -> int:
        descriptor = int(_librt.mq_open(b"/job-queue", flags, 0o600, None))
        if descriptor < 0:
            return -ctypes.get_errno()
        os.close(descriptor)
        return descriptor

    assert instance.run_as_account(lambda: open_queue(os.O_CREAT | os.O_RDWR)) >= 0
    assert (queues / "job-queue").stat().st_uid == instance.account.pw_uid

    # When the scrub runs
    report = scrub_of(instance).run(session_id=None)

    # Then it reports the instance clean, and the next job cannot open the queue
    assert report.left == []
    assert not (queues / "job-queue").exists()
    assert instance.run_as_account(lambda: open_queue(os.O_RDONLY)) == -2  # ENOENT


def test_files_a_job_left_on_a_tmpfs_outside_the_temporary_directories_are_removed(
    instance: InstanceRoot,
) -> None:
    # Given a tmpfs everyone may write, as /run/lock is, and a job that left a file and a directory there
    lock = mounted(instance, "tmpfs", "run/lock", options="mode=1777,size=1m")
    run_job(
        instance,
        f"#!/bin/sh\necho token > {lock}/job-lock\nmkdir {lock}/job-dir\necho x > {lock}/job-dir/f\n",
    )
    assert (lock / "job-lock").stat().st_uid == instance.account.pw_uid

    # When the scrub runs
    report = scrub_of(instance).run(session_id=None)

    # Then it reports the instance clean, and nothing of the job is left on the tmpfs
    assert report.left == []
    assert list(lock.iterdir()) == []


def test_files_of_a_subordinate_uid_are_removed_from_scratch_and_refuse_the_instance_elsewhere(
    instance: InstanceRoot,
) -> None:
    # Given files a job's user namespace made as a subordinate uid (no account has it): one in /tmp and
    # one in a directory the operator made writable to everyone
    assert SUBORDINATE_UID not in {entry.pw_uid for entry in pwd.getpwall()}
    in_tmp = instance.path("tmp/from-a-namespace")
    in_tmp.write_text("x")
    shared = instance.path("opt/shared")
    shared.mkdir(parents=True)
    shared.chmod(0o1777)
    elsewhere = shared / "from-a-namespace"
    elsewhere.write_text("x")
    for path in (in_tmp, elsewhere):
        os.chown(path, SUBORDINATE_UID, SUBORDINATE_UID)

    # When the scrub runs
    report = scrub_of(instance).run(session_id=None)

    # Then the one in /tmp is gone, and the other refuses the instance, named with its uid
    assert not in_tmp.exists()
    assert report.left == [
        f"files of uids no account has, where the runner account can write: {elsewhere} (uid {SUBORDINATE_UID})"
    ]


def test_files_of_unknown_uids_where_the_account_cannot_write_are_the_operators(
    instance: InstanceRoot,
) -> None:
    # Given a tool the operator unpacked as root, keeping its archive's uids (tar does), into root's /opt
    tool = instance.path("opt/node/bin")
    tool.mkdir(parents=True)
    (tool / "node").write_text("#!/bin/sh\n")
    for path in (tool.parent, tool, tool / "node"):
        os.chown(path, 4242424, 4242424)

    # When the scrub runs / Then the instance is clean and the tool is left alone
    assert scrub_of(instance).run(session_id=None).left == []
    assert (tool / "node").exists()


def test_a_subordinate_uid_range_of_the_runner_account_refuses_the_instance(instance: InstanceRoot) -> None:
    # Given a range for the runner account in /etc/subuid, as useradd adds by default (SUB_UID_COUNT)
    subuid = instance.path("etc/subuid")
    subuid.write_text(f"someone-else:165536:65536\n{instance.account.pw_name}:100000:65536\n")

    # When the scrub runs / Then the instance is refused, naming the range
    report = scrub_of(instance).run(session_id=None)
    assert report.left == [
        f"{subuid} gives the runner account a range: {instance.account.pw_name}:100000:65536"
    ]


def test_where_keyctl_is_refused_the_scrub_has_no_keys_to_clear(
    instance: InstanceRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a machine whose seccomp profile refuses keyctl(2) (Docker's default does), to the job as to
    # the agent
    def refused(*_: int) -> int:
        ctypes.set_errno(1)  # EPERM
        return -1

    monkeypatch.setattr(kernel_objects, "_keyctl", lambda: refused)

    # When the scrub runs / Then it is clean: no job could have added a key either
    assert scrub_of(instance).run(session_id=None).left == []


def mounted(instance: InstanceRoot, fstype: str, relative: str, options: str) -> Path:
    """`instance.mount`, the test skipped with mount's reason where this machine refuses root a mount."""
    try:
        return instance.mount(fstype, relative, options=options)
    except MountRefusedError as refused:
        pytest.skip(str(refused))
