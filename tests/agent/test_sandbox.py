"""The runner's sandbox: on an instance the agent starts each job's runner as a transient systemd service
with exactly these properties (agent/sandbox.py; issue 36, item 1), and without systemd as its own child.

systemd itself is not here (nor on CI): the command given to systemd-run is checked property by
property, and a stand-in systemd-run does what systemd would do with it that the agent depends on (the
service's own cgroup, the account, the working directory, systemd's environment, the output through
systemd-run), so the real agent can serve a job through it and scrub after it.
"""

from __future__ import annotations

import contextlib
import grp
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.log import agent_log
from agent.processes import JobCgroup
from agent.runner import RunnerProcess
from agent.sandbox import LEFT_OUT, SANDBOX, SLICE, JobUnit
from agent.scrub import build_scrub
from emulator.instance_root import InstanceRoot, instance_root
from runner_pool.domain.records import Signal
from tests.agent.conftest import AgentFactory, ControlPlane, eventually, idle_agent
from tests.agent.test_agent_scrub import LISTENER, RUN, jit_config_holding

STAND_IN_SYSTEMD_RUN = """#!/bin/sh
# Stands in for systemd-run --pipe --wait: records its arguments, then runs the command after -- as
# systemd would run the service: in the service's cgroup, as User=, in WorkingDirectory=, with systemd's
# environment and the account's HOME, USER, LOGNAME and SHELL (systemd.exec(5)), its output ours.
printf '%s\\n' "$@" > {record}
for argument; do
    case "$argument" in
        --unit=*) unit="${{argument#--unit=}}" ;;
        --slice=*) slice="${{argument#--slice=}}" ;;
        --property=User=*) user="${{argument#--property=User=}}" ;;
        --property=WorkingDirectory=*) cwd="${{argument#--property=WorkingDirectory=}}" ;;
    esac
done
mkdir -p "{cgroup_root}/$slice/$unit.service"
echo $$ > "{cgroup_root}/$slice/$unit.service/cgroup.procs"
while [ "$1" != "--" ]; do shift; done
shift
cd "$cwd"
home="$(getent passwd "$user" | cut -d: -f6)"
exec /usr/bin/setpriv --reuid="$(id -u "$user")" --regid="$(id -g "$user")" --init-groups \\
    /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    HOME="$home" USER="$user" LOGNAME="$user" SHELL=/bin/sh "$@"
"""


@pytest.fixture
def instance() -> Iterator[InstanceRoot]:
    with instance_root(LISTENER) as made:
        yield made


@pytest.fixture
def sandbox(instance: InstanceRoot) -> Iterator[dict[str, object]]:
    """The agent's settings for the sandbox, its cgroups in one of this test's own (cgroup v2), its
    systemd-run the stand-in; after the test, the stand-in's cgroups are removed."""
    if instance.cgroup_root is None:
        pytest.skip(
            "no cgroup v2 hierarchy root may make cgroups in here: the service's cgroup cannot be made"
        )
    cgroup_root = JobCgroup.below_own(f"runner-pool-test-{uuid.uuid4().hex[:8]}", instance.cgroup_root).path
    systemd_run = instance.path("usr/bin/systemd-run")
    systemd_run.parent.mkdir(parents=True)
    systemd_run.write_text(
        STAND_IN_SYSTEMD_RUN.format(record=instance.path("systemd-run-arguments"), cgroup_root=cgroup_root)
    )
    systemd_run.chmod(0o755)
    yield {
        "job_unit": "runner-pool-job",
        "cgroup_root": cgroup_root,
        "job_cgroup": None,
        "systemd_run": systemd_run,
    }
    jobs = JobCgroup(cgroup_root / SLICE)

    def services_ended() -> bool:
        jobs.kill()
        return not jobs.pids()

    eventually(services_ended, what="the services' processes ended")
    for directory in (*jobs.path.glob("*.service"), jobs.path, cgroup_root):
        with contextlib.suppress(OSError):
            directory.rmdir()


def expected_command(instance: InstanceRoot, unit: str, systemd_run: Path, stop_seconds: str) -> list[str]:
    account = instance.account
    return [
        str(systemd_run),
        f"--unit={unit}",
        "--slice=runner-pool-jobs.slice",
        "--service-type=exec",
        "--collect",
        "--pipe",
        "--wait",
        "--quiet",
        f"--property=User={account.pw_name}",
        f"--property=Group={grp.getgrgid(account.pw_gid).gr_name}",
        f"--property=WorkingDirectory={instance.runner_dir}",
        "--property=PrivateTmp=yes",
        "--property=RemoveIPC=yes",
        "--property=KeyringMode=private",
        "--property=NoNewPrivileges=yes",
        "--property=RestrictSUIDSGID=yes",
        "--property=ProtectKernelTunables=yes",
        "--property=ProtectControlGroups=yes",
        "--property=KillMode=control-group",
        "--property=KillSignal=SIGINT",
        "--property=SendSIGKILL=yes",
        f"--property=TimeoutStopSec={stop_seconds}",
        "--",
        str(instance.runner_dir / "run.sh"),
    ]


def test_the_runner_service_has_exactly_the_sandboxs_properties(instance: InstanceRoot) -> None:
    # Given the services the agent starts runners as
    unit = JobUnit("runner-pool-job", Path("/sys/fs/cgroup"), 30, Path("/usr/bin/systemd-run"))

    # When it is asked for the command that starts run.sh as the runner account, for a job
    command = unit.command(
        instance.runner_dir / "run.sh", job="0123456789ab", cwd=instance.runner_dir, account=instance.account
    )

    # Then it is systemd-run with every property of the sandbox, the service named for the job, and the
    # job's processes are in the jobs' slice
    assert command == expected_command(
        instance, "runner-pool-job-0123456789ab", Path("/usr/bin/systemd-run"), "30s"
    )
    assert unit.cgroup.path == Path("/sys/fs/cgroup/runner-pool-jobs.slice")


def test_the_agent_serves_a_job_through_the_sandboxed_service_and_scrubs_after_it(
    control_plane: ControlPlane, agents: AgentFactory, instance: InstanceRoot, sandbox: dict[str, object]
) -> None:
    # Given an idle instance whose agent starts the runner as a sandboxed service
    idle_agent(control_plane, agents, None, **instance.settings(**sandbox, stop_timeout_seconds=5))

    # When a run claims it and its runner listens
    control_plane.claim(RUN, jit_config_holding("https://pipelines.invalid/secret"))
    control_plane.await_signal(Signal.UD_REG_OK, RUN)

    # Then the runner was started through systemd-run with exactly the sandbox's properties
    systemd_run = sandbox["systemd_run"]
    assert isinstance(systemd_run, Path)
    unit, *recorded = instance.path("systemd-run-arguments").read_text().splitlines()
    assert re.fullmatch(r"--unit=runner-pool-job-[0-9a-f]{12}", unit)
    assert recorded == expected_command(instance, unit.removeprefix("--unit="), systemd_run, "5s")[2:]
    # And it runs as the runner account, in the service's cgroup, with none of the agent's environment
    service = build_scrub(instance.agent_settings(**sandbox)).cgroup
    assert service is not None
    listener = eventually(service.pids, what="the runner in the service's cgroup")
    for pid in listener:
        assert Path(f"/proc/{pid}").stat().st_uid == instance.account.pw_uid
        environment = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert not [v for v in environment if v.startswith((b"RUNNER_POOL_", b"AWS_"))]

    # When the job runs, leaves a detached process, and is released
    control_plane.activate(RUN)
    (instance.runner_dir / "_work/job-handed-over").write_text(str(instance.root))
    eventually((instance.home / ".git-credentials").exists, what="the job's files")
    control_plane.release(RUN)

    # Then the agent gives its receipt, and nothing of the job is left in the service's cgroup or elsewhere
    control_plane.await_signal(Signal.UD_REMOVE_REG_OK, RUN)
    assert service.pids() == set()
    assert instance.processes_of_the_job() == []
    assert not (instance.home / ".git-credentials").exists()


def test_stopping_the_runner_service_is_ctrl_c_to_every_process_of_the_job(
    instance: InstanceRoot, sandbox: dict[str, object]
) -> None:
    # Given a runner started as the service, which says when Ctrl-C reaches it
    listener = instance.runner_dir / "bin/Runner.Listener"
    listener.write_text(
        "#!/bin/sh\ntrap 'echo interrupted > \"$HOME/stopped\"; exit 0' INT\n"
        "echo 'Listening for Jobs'\nwhile :; do sleep 0.02; done\n"
    )
    unit = JobUnit(
        str(sandbox["job_unit"]), Path(str(sandbox["cgroup_root"])), 5, Path(str(sandbox["systemd_run"]))
    )
    runner = RunnerProcess.start(
        instance.runner_dir / "run.sh",
        cwd=instance.runner_dir,
        user=instance.account.pw_name,
        log=agent_log(),
        unit=unit,
    )
    runner.wait_until_listening(10)

    # When the agent stops it (a grace long enough for a loaded machine to run the trap: stop returns as
    # soon as the runner has ended, and one that outlives the grace is killed, so the check below fails)
    runner.stop(30)

    # Then Ctrl-C reached the runner in its service (not only systemd-run), which ended with it
    assert (instance.home / "stopped").read_text() == "interrupted\n"
    assert not runner.running
    assert unit.cgroup.pids() == set()


def test_without_a_job_unit_the_runner_is_the_agents_own_child_as_in_the_emulator(
    instance: InstanceRoot,
) -> None:
    # Given the settings of a host without systemd (no job unit) / Then the scrub knows no service
    scrub = build_scrub(instance.agent_settings())
    assert scrub.unit is None
    # And with one, the job's cgroup is the service's
    with_unit = build_scrub(
        instance.agent_settings(job_unit="runner-pool-job", cgroup_root=Path("/sys/fs/cgroup"))
    )
    assert with_unit.unit is not None
    assert with_unit.cgroup is not None
    assert with_unit.cgroup.path == Path("/sys/fs/cgroup/runner-pool-jobs.slice")


def test_the_readme_names_each_directive_of_the_sandbox_and_each_left_out() -> None:
    # Given the sandbox's table and the README's security model
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    security_model = readme[readme.index("## Security model") :]
    security_model = security_model[: security_model.index("\n## ", 1)]

    # Then every directive is in one list or the other, never both, and the README names each
    assert not {d.name for d in SANDBOX} & LEFT_OUT.keys()
    assert [d.name for d in SANDBOX if f"`{d.name}={d.value}`" not in security_model] == []
    assert [name for name in LEFT_OUT if f"`{name}`" not in security_model] == []
