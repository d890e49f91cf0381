"""The real scrub on a throwaway instance: a job as a real account plants every kind of residue it can,
and after the scrub none survives, or the instance is refused with the reason (issue 14, items 3-4).

The job is started the way the agent starts the runner (agent/runner.py: its own session, in the job's
cgroup, as the runner account); docker is the in-memory daemon of fake_docker.py.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.docker import PREDEFINED_NETWORKS
from agent.runner_install import RunnerInstall, RunnerInstallError
from agent.scrub import Scrub, build_scrub
from emulator.fake_docker import FakeDocker
from emulator.instance_root import (
    RESIDUE_JOB,
    SKELETON,
    InstanceRoot,
    instance_root,
    plant_in_docker,
    run_job,
)
from tests.agent.conftest import process_alive

BASE_IMAGE = "ubuntu:24.04"
"""Pulled before the first job (by the pre-runner script): the agent keeps it through every scrub."""


@pytest.fixture
def instance() -> Iterator[InstanceRoot]:
    with instance_root() as made:
        yield made


@pytest.fixture
def docker() -> FakeDocker:
    """The daemon at first boot: the operator's base image only."""
    daemon = FakeDocker()
    daemon.pull(BASE_IMAGE)
    return daemon


def plant(instance: InstanceRoot, docker: FakeDocker) -> dict[str, Path | str]:
    """Every kind of residue a job can leave; returns each kind and where it is."""
    job = run_job(instance, RESIDUE_JOB)
    assert job.exited_without_job()  # it printed no "Running job:", only what it planted
    user = instance.account.pw_name
    planted: dict[str, Path | str] = {
        "docker credentials": instance.home / ".docker/config.json",
        "buildx builder": instance.home / ".docker/buildx/instances/job-builder",
        "npm token": instance.home / ".npmrc",
        "git credentials": instance.home / ".git-credentials",
        "ssh key": instance.home / ".ssh/id_ed25519",
        "user systemd unit": instance.home / ".config/systemd/user/miner.service",
        "file in /tmp": instance.path("tmp/job-cache"),
        "directory in /tmp": instance.path("tmp/job-dir"),
        "file in /var/tmp": instance.path("var/tmp/job-file"),
        "file in /dev/shm": instance.path("dev/shm/job-shm"),
        "file in $TMPDIR": instance.runner_dir / "_work/_temp/job-tmpdir",
        "file added to the runner's directory": instance.runner_dir / ".env",
    }
    # crontab(1) is setgid crontab and writes the spool file for the user; logind writes the
    # linger marker when the user runs `loginctl enable-linger`
    crontab = instance.path(f"var/spool/cron/crontabs/{user}")
    crontab.write_text("* * * * * curl -s https://example.invalid/beacon\n")
    instance.as_account(crontab)
    planted["crontab"] = crontab
    linger = instance.path(f"var/lib/systemd/linger/{user}")
    linger.touch()
    planted["linger marker"] = linger
    for path in planted.values():
        assert isinstance(path, Path)
        assert path.exists(), path
    assert (instance.home / ".bashrc").read_text() != SKELETON[".bashrc"]
    planted[".bashrc line"] = "example.invalid/steal"
    assert instance.path(f"var/spool/mail/{user}").stat().st_size > 0
    planted["mail spool"] = "mail for the next job"
    # The one thing it could not do: the runner's program is read-only to the account
    assert "steal" not in (instance.runner_dir / "run.sh").read_text()
    detached = instance.processes_of_the_job()
    assert detached, "the job's detached process is running"
    planted["detached background process"] = f"pids {detached}"
    if instance.cgroup is not None:
        # A process under another uid, in its own session, as `sudo` (use_pty) starts one
        sudo = subprocess.Popen(
            ["/usr/bin/setsid", "/usr/bin/sleep", "600"],
            preexec_fn=instance.cgroup.enter,  # noqa: PLW1509
        )
        planted["process under another uid (sudo)"] = f"pid {sudo.pid}"
    plant_in_docker(docker)
    planted |= {"docker container": "node:20", "docker volume": "npm-cache", "docker network": "job-net"}
    planted["docker image"] = "postgres:16"
    planted["docker build cache"] = f"{len(docker.build_cache)} records"
    return planted


def scrub_of(instance: InstanceRoot, docker: FakeDocker) -> Scrub:
    """The scrub as the agent builds it, keeping the images docker had at first boot, as the agent does."""
    scrub = build_scrub(instance.agent_settings(), docker=lambda: docker)
    scrub.keep_images([docker.pull(BASE_IMAGE)])  # already there: its id
    return scrub


def test_every_kind_of_residue_a_job_plants_is_gone_after_the_scrub(
    instance: InstanceRoot, docker: FakeDocker
) -> None:
    # Given a job that planted every kind of residue it can as the runner account
    planted = plant(instance, docker)
    assert len(planted) >= 12
    detached = instance.processes_of_the_job()

    # When the real scrub runs
    report = scrub_of(instance, docker).run(session_id=None)

    # Then it reports the instance clean
    assert report.left == []
    # And none of the residue survives: files and directories...
    for kind, where in planted.items():
        if isinstance(where, Path):
            assert not os.path.lexists(where), f"{kind} survived: {where}"
    # ...the home is the skeleton again, the mail spool empty...
    assert {p.name for p in instance.home.iterdir()} == set(SKELETON)
    assert all((instance.home / name).read_text() == text for name, text in SKELETON.items())
    assert instance.path(f"var/spool/mail/{instance.account.pw_name}").stat().st_size == 0
    # ...no process of the job, whatever its uid or session...
    assert instance.processes_of_the_job() == []
    assert not any(process_alive(pid) for pid in detached)
    # ...nothing in docker but the base image and the predefined networks...
    assert docker.containers() == []
    assert docker.volumes() == []
    assert docker.networks() == []
    assert [sorted(image.references) for image in docker.images()] == [["ubuntu:24.04"]]
    assert docker.network_names == set(PREDEFINED_NETWORKS)
    assert docker.build_cache == set()
    # ...and the runner's directory is as installed, its work and log directories empty and the account's
    assert RunnerInstall(instance.runner_dir, instance.manifest, None, None).verify(full=True) == []
    for own in ("_work", "_diag"):
        assert list((instance.runner_dir / own).iterdir()) == []
        assert (instance.runner_dir / own).stat().st_uid == instance.account.pw_uid


def test_a_runner_file_changed_by_root_refuses_the_instance_with_the_reason(
    instance: InstanceRoot, docker: FakeDocker
) -> None:
    # Given a job that (with root, which the account does not have) changed the runner's program
    listener = instance.runner_dir / "bin/Runner.Listener"
    listener.write_text(listener.read_text().replace("listener", "listenex"))  # same size

    # When the scrub runs / Then the instance is refused, naming the file
    report = scrub_of(instance, docker).run(session_id=None)
    assert not report.clean
    assert "runner file changed: bin/Runner.Listener" in report.reason()


def test_a_file_the_account_owns_where_the_scrub_does_not_clean_refuses_the_instance(
    instance: InstanceRoot, docker: FakeDocker
) -> None:
    # Given a directory the operator made writable to everyone, and a job that wrote there
    cache = instance.path("opt/cache")
    cache.mkdir(parents=True)
    cache.chmod(0o1777)
    run_job(instance, f"#!/bin/sh\necho token > {cache}/left-for-the-next-job\n")

    # When the scrub runs / Then the instance is refused, naming what is left
    report = scrub_of(instance, docker).run(session_id=None)
    assert not report.clean
    assert f"files of the runner account: {cache}/left-for-the-next-job" in report.reason()
    assert len(report.reason()) < 500


def test_the_runner_is_checked_before_each_start_hashed_unless_the_scrub_just_hashed_it(
    instance: InstanceRoot,
) -> None:
    runner = RunnerInstall(
        instance.runner_dir, instance.manifest, instance.account.pw_uid, instance.account.pw_gid
    )
    # Given an installed runner: it passes the check before its first start (a full one)
    runner.check_before_start()
    # When a file is planted in its directory, or one is changed without changing its size or times
    (instance.runner_dir / ".path").write_text("/opt/evil:/usr/bin\n")
    # Then the next start is refused, naming it
    with pytest.raises(RunnerInstallError, match=r"runner file added: \.path"):
        runner.check_before_start()
    (instance.runner_dir / ".path").unlink()
    listener = instance.runner_dir / "bin/Runner.Listener"
    before = listener.stat()
    listener.write_text(listener.read_text().replace("listener", "listenex"))
    os.utime(listener, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert runner.verify(full=False) == ["runner file changed: bin/Runner.Listener (ctime_ns)"]
    assert runner.verify(full=True) == ["runner file changed: bin/Runner.Listener (ctime_ns, sha256)"]


def test_the_jit_config_files_are_the_accounts_alone_and_never_written_through_a_planted_link(
    instance: InstanceRoot,
) -> None:
    runner = RunnerInstall(
        instance.runner_dir, instance.manifest, instance.account.pw_uid, instance.account.pw_gid
    )
    # Given a link the account planted where the runner's settings go, aimed at a file of root's
    target = instance.path("etc/shadow-of-root")
    target.write_text("root's\n")
    link = instance.runner_dir / ".credentials"
    link.symlink_to(target)
    instance.as_account(link)
    # When the agent writes the config's files
    runner.install_config({".runner": b'{"agentId": 1}', ".credentials": b'{"token": "secret"}'})
    # Then root's file is untouched, and each settings file is a plain file the account alone can read
    assert target.read_text() == "root's\n"
    for name in (".runner", ".credentials"):
        info = (instance.runner_dir / name).lstat()
        assert (info.st_uid, oct(info.st_mode & 0o777)) == (instance.account.pw_uid, "0o600")
        assert not (instance.runner_dir / name).is_symlink()


def test_a_runner_account_that_may_use_the_docker_socket_refuses_the_instance(
    instance: InstanceRoot, docker: FakeDocker
) -> None:
    # Given a docker socket whose group, with write access, is one of the runner account's (as the
    # `docker` group would be, were the account put in it)
    socket = instance.path("var/run/docker.sock")
    socket.touch()
    os.chown(socket, 0, instance.account.pw_gid)
    socket.chmod(0o660)

    # When the scrub runs after a job / Then the instance is refused: its job could have been root
    report = scrub_of(instance, docker).run(session_id=None)
    assert report.left == [
        f"the runner account may use the docker daemon ({socket}), so a job could act as root"
    ]


def test_an_operators_session_during_the_job_refuses_the_instance(
    instance: InstanceRoot, docker: FakeDocker
) -> None:
    # Given a clean instance, whose scrub finds no operator's session
    scrub = scrub_of(instance, docker)
    assert scrub.operator_session() is None
    # And an operator who opened a Session Manager session on it while its job ran (the SSM agent made
    # its account)
    with instance.path("etc/passwd").open("a") as accounts:
        accounts.write("ssm-user:x:1001:1001::/home/ssm-user:/bin/bash\n")

    # When the scrub runs after the job / Then the instance is refused: a root shell no scrub can undo
    report = scrub_of(instance, docker).run(session_id=None)
    assert report.left == [
        "an operator's Session Manager session ran here (the account ssm-user exists), so the instance "
        "is not reused"
    ]


def test_a_docker_socket_the_runner_account_cannot_use_is_no_reason_to_refuse(
    instance: InstanceRoot, docker: FakeDocker
) -> None:
    # Given docker's socket as the distribution installs it: root's, group docker, the account not in it
    socket = instance.path("var/run/docker.sock")
    socket.touch()
    socket.chmod(0o660)

    # When the scrub runs / Then the instance is clean
    assert scrub_of(instance, docker).run(session_id=None).left == []
