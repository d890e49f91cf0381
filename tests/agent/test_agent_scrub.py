"""The real agent serving a job as a real runner account: the runner's credentials are never in a process's
arguments or environment, the scrub runs on release, and an instance whose scrub left something serves
no other job (issue 14, item 3).
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from emulator.fake_docker import FakeDocker
from emulator.instance_root import InstanceRoot, instance_root, plant_in_docker
from runner_pool.domain.records import Signal
from tests.agent.conftest import AgentFactory, ControlPlane, eventually, idle_agent, pooled_agent
from tests.support import builders

RUN = builders.run_key(7, "/class=large")
NEXT_RUN = builders.run_key(8, "/class=large")

LISTENER = """#!/bin/sh
# Stands in for Runner.Listener: loads its settings from the files the agent wrote (as the real one
# does when run.sh is given no --jitconfig), listens until the test hands it its job, runs it, exits.
cd "$(dirname "$0")/.."
grep -q agentId .runner || { echo "An error occurred: the runner is not configured"; exit 1; }
echo "$(date -u '+%Y-%m-%d %H:%M:%SZ'): Listening for Jobs"
while [ ! -e _work/job-handed-over ]; do sleep 0.02; done
echo "$(date -u '+%Y-%m-%d %H:%M:%SZ'): Running job: build"
echo 'https://x-access-token:ghs_job@github.com' > "$HOME/.git-credentials"
echo cache > "$(cat _work/job-handed-over)/tmp/job-cache"
setsid sleep 600 </dev/null >/dev/null 2>&1 &
echo "$(date -u '+%Y-%m-%d %H:%M:%SZ'): Job build completed with result: Succeeded"
"""


@pytest.fixture
def instance() -> Iterator[InstanceRoot]:
    with instance_root(LISTENER) as made:
        yield made


def jit_config_holding(secret: str) -> str:
    files = {
        ".runner": {"agentId": 7, "agentName": "i-0a1b-1", "ephemeral": True, "workFolder": "_work"},
        ".credentials": {"scheme": "OAuth", "data": {"clientId": "c", "authorizationUrl": secret}},
    }
    return base64.b64encode(
        json.dumps({n: base64.b64encode(json.dumps(c).encode()).decode() for n, c in files.items()}).encode()
    ).decode()


def processes_showing(secret: str) -> list[str]:
    """Every process whose arguments or environment hold `secret` (root reads them all)."""
    showing = []
    for process in Path("/proc").iterdir():
        for view in ("cmdline", "environ"):
            try:
                if secret.encode() in (process / view).read_bytes():
                    showing.append(f"{process.name}/{view}")
            except OSError:
                continue
    return showing


def test_a_job_on_a_runner_account_never_sees_the_runner_config_and_leaves_nothing_behind(
    control_plane: ControlPlane, agents: AgentFactory, instance: InstanceRoot
) -> None:
    # Given an idle instance whose agent runs its runner as an account of its own, and whose docker
    # holds an image pulled before the first job (by the pre-runner script)
    docker = FakeDocker()
    base_image = docker.pull("ubuntu:24.04")
    idle_agent(control_plane, agents, docker, **instance.settings())

    # When a run claims it with a JIT config holding a secret, and the runner listens
    secret = f"https://pipelines.invalid/{uuid.uuid4().hex}"
    control_plane.claim(RUN, jit_config_holding(secret))
    control_plane.await_signal(Signal.UD_REG_OK, RUN)

    # Then the secret is in the runner's settings file, the account's alone, and in no process's
    # arguments or environment (the agent, in this process, holds it in memory only)
    credentials = instance.runner_dir / ".credentials"
    assert secret in credentials.read_text()
    assert credentials.stat().st_uid == instance.account.pw_uid
    assert oct(credentials.stat().st_mode & 0o777) == "0o600"
    assert processes_showing(secret) == []

    # When the job runs (it leaves credentials, a temp file and a detached process) and is released
    control_plane.activate(RUN)
    handed = instance.runner_dir / "_work/job-handed-over"
    handed.write_text(str(instance.root))
    eventually((instance.home / ".git-credentials").exists, what="the job's files")
    eventually(instance.processes_of_the_job, what="the job's detached process")
    plant_in_docker(docker)
    control_plane.release(RUN)

    # Then the agent gives its receipt, and nothing of the job is left
    control_plane.await_signal(Signal.UD_REMOVE_REG_OK, RUN)
    assert not (instance.home / ".git-credentials").exists()
    assert not instance.path("tmp/job-cache").exists()
    assert not credentials.exists()
    assert instance.processes_of_the_job() == []
    # And docker holds what it held at first boot, the image the job did not pull kept
    assert (docker.containers(), docker.volumes(), docker.networks()) == ([], [], [])
    assert [image.id for image in docker.images()] == [base_image]


def test_an_instance_whose_scrub_left_something_refuses_every_later_run(
    control_plane: ControlPlane, agents: AgentFactory, instance: InstanceRoot
) -> None:
    # Given an instance that served RUN, whose job wrote where the scrub does not clean (a directory
    # the operator opened to every account)
    shared = instance.path("opt/shared-cache")
    shared.mkdir(parents=True)
    shared.chmod(0o1777)
    pooled_agent(control_plane, agents, **instance.settings())
    control_plane.claim(RUN, jit_config_holding("s1"))
    control_plane.await_signal(Signal.UD_REG_OK, RUN)
    control_plane.activate(RUN)
    (shared / "left-by-the-job").touch()
    instance.as_account(shared / "left-by-the-job")

    # When it is released
    control_plane.release(RUN)

    # Then the agent refuses the receipt, saying what was left
    failed = control_plane.await_reason(Signal.UD_REMOVE_REG_FAILED, RUN)
    assert f"files of the runner account: {shared}/left-by-the-job" in failed

    # And should the instance be claimed again anyway, it starts no runner and says why
    control_plane.claim(NEXT_RUN, jit_config_holding("s2"))
    refused = control_plane.await_reason(Signal.UD_REG_FAILED, NEXT_RUN)
    assert refused.startswith("not registering: the scrub left: files of the runner account")


def test_an_instance_an_operator_opened_a_session_on_while_it_was_idle_serves_no_later_run(
    control_plane: ControlPlane, agents: AgentFactory, instance: InstanceRoot
) -> None:
    # Given an instance that served RUN and was scrubbed clean, back in the pool
    control_plane.launch_for_pool()
    agents.start(**instance.settings())
    control_plane.claim(RUN, jit_config_holding("s1"))
    control_plane.await_signal(Signal.UD_REG_OK, RUN)
    control_plane.activate(RUN)
    control_plane.release(RUN)
    control_plane.await_signal(Signal.UD_REMOVE_REG_OK, RUN)

    # When an operator opens a Session Manager session on it (the SSM agent adds its account)
    with instance.path("etc/passwd").open("a") as accounts:
        accounts.write("ssm-user:x:1001:1001::/home/ssm-user:/bin/bash\n")

    # Then, claimed again, it starts no runner and says why
    control_plane.claim(NEXT_RUN, jit_config_holding("s2"))
    refused = control_plane.await_reason(Signal.UD_REG_FAILED, NEXT_RUN)
    assert refused.startswith("not registering: an operator's Session Manager session ran here")


def test_an_instance_whose_runner_is_not_as_installed_fails_its_boot(
    control_plane: ControlPlane, agents: AgentFactory, instance: InstanceRoot
) -> None:
    # Given an instance whose runner program changed after the boot recorded its manifest
    listener = instance.runner_dir / "bin/Runner.Listener"
    listener.write_text(listener.read_text() + "# changed\n")

    # When its agent starts / Then it signals UD_FAILED naming the file, and never serves a job
    agents.start(**instance.settings())
    failed = control_plane.await_reason(Signal.UD_FAILED, None)
    assert failed.startswith(
        "the runner program is not as installed: runner file changed: bin/Runner.Listener"
    )
