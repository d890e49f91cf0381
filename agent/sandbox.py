"""The transient systemd service each job's runner runs in: a sandbox the kernel enforces while the job
runs, before the scrub cleans up after it.

The agent starts the runner with `systemd-run` (systemd-run(1)) as a service of its own, named anew
for each job (`runner-pool-job-<id>`), in a slice of the jobs' own, whose cgroup is the job's
(agent/processes.py: everything the job starts, under any uid, stays in it and is killed with it). A
new name per job means the next job's service never waits for systemd to unload the last one's.

Each directive below is systemd.exec(5)'s
(https://www.freedesktop.org/software/systemd/man/latest/systemd.exec.html) or, for how the service
is stopped, systemd.kill(5)'s; each row says what it does for a job. Those left out are in `LEFT_OUT`,
with why. Where there is no systemd (the emulator, the tests, a host without it), the agent starts the
runner as its own child instead (agent/runner.py), without this sandbox.
"""

from __future__ import annotations

import grp
import pwd
from dataclasses import dataclass
from pathlib import Path

from agent.processes import JobCgroup

SLICE = "runner-pool-jobs.slice"
"""The jobs' slice (systemd.slice(5)): systemd makes it when a service names it. Its cgroup holds each
job's service's, so the job's processes are found under it whatever the service's name."""


@dataclass(frozen=True)
class Directive:
    name: str
    value: str
    why: str


SANDBOX: tuple[Directive, ...] = (
    Directive(
        "PrivateTmp",
        "yes",
        "systemd.exec(5) PrivateTmp=: a /tmp and /var/tmp of the service's own, removed when it stops; no "
        "job reads another's temporary files, and nothing there outlives the job. The docker daemon, "
        "outside the service, sees the instance's /tmp: a job bind-mounts from $RUNNER_TEMP instead",
    ),
    Directive(
        "RemoveIPC",
        "yes",
        "systemd.exec(5) RemoveIPC=: System V and POSIX IPC objects of the service's user and group are "
        "removed when it stops (only for User=/Group= services, and never for system users: the runner "
        "account is not one)",
    ),
    Directive(
        "KeyringMode",
        "private",
        "systemd.exec(5) KeyringMode=: a session keyring of the service's own, not linked to the user's "
        "keyring, gone with the service; the user keyring itself is the scrub's to clear",
    ),
    Directive(
        "NoNewPrivileges",
        "yes",
        "systemd.exec(5) NoNewPrivileges=: no process of the job gains privileges through execve(), so "
        "no setuid or setgid program (sudo, su, newuidmap) and no file capability works for it",
    ),
    Directive(
        "RestrictSUIDSGID",
        "yes",
        "systemd.exec(5) RestrictSUIDSGID=: the job cannot make a setuid or setgid file, which would "
        "outlive it as a way back into the account",
    ),
    Directive(
        "ProtectKernelTunables",
        "yes",
        "systemd.exec(5) ProtectKernelTunables=: /proc/sys, /sys and the like are read-only to the job",
    ),
    Directive(
        "ProtectControlGroups",
        "yes",
        "systemd.exec(5) ProtectControlGroups=: the cgroup hierarchy is read-only to the job, so nothing "
        "of it leaves the job's cgroup",
    ),
)
"""The sandbox: what the kernel enforces on every process of the job."""

LEFT_OUT: dict[str, str] = {
    "ProtectSystem": "strict or full makes /usr, /etc (and with strict everything) read-only: the account "
    "cannot write them anyway, and strict would take the runner's own directory and work folder from it",
    "ProtectHome": "the runner account's home is under /home, and jobs use it",
    "PrivateDevices": "hides /dev/kvm and GPUs, which emulator, virtualisation and GPU jobs need",
    "ProtectKernelModules": "makes /usr/lib/modules inaccessible, which jobs that build kernel modules read",
    "ProtectClock": "implies a device allow-list (DeviceAllow=char-rtc r) that closes other devices too; the "
    "account cannot set the clock anyway",
    "ProtectKernelLogs": "the account reads the kernel log only where kernel.dmesg_restrict allows it, and "
    "the device rules this implies were not checked against the jobs' devices",
    "PrivateNetwork": "jobs need the network",
    "PrivateUsers": "maps every other uid to nobody, which breaks files the job shares with containers",
    "RestrictNamespaces": "forbids user namespaces, which browsers' sandboxes (Chrome), bubblewrap and "
    "rootless containers use; without a subordinate uid range the account's namespaces map only itself",
    "MemoryDenyWriteExecute": "breaks every JIT: the runner itself (.NET), Node.js, the JVM",
    "SystemCallFilter": "a CI job runs arbitrary programs; no allow-list fits them",
    "LockPersonality": "breaks setarch/linux32, which 32-bit builds use",
    "CapabilityBoundingSet": "adds nothing here: an account that is not root, under NoNewPrivileges=, gains "
    "no capability through execve()",
}
"""systemd.exec(5) directives left out, and why: most would break jobs a CI runner must run, two add
nothing for an account that is not root."""


@dataclass(frozen=True)
class JobUnit:
    """The transient services jobs' runners run in, one at a time: `prefix` and an id name each."""

    prefix: str
    cgroup_root: Path
    stop_timeout_seconds: float
    systemd_run: Path = Path("/usr/bin/systemd-run")

    @property
    def cgroup(self) -> JobCgroup:
        """The jobs' slice's cgroup, which holds the service's (systemd.resource-control(5): a unit's
        cgroup is named after its slice and itself)."""
        return JobCgroup(self.cgroup_root / SLICE)

    def name(self, job: str) -> str:
        return f"{self.prefix}-{job}"

    def properties(self, account: pwd.struct_passwd, cwd: Path) -> list[str]:
        """Every property of the service, in systemd-run's `--property=NAME=VALUE` form."""
        stop = [
            # systemd.kill(5): stopping the service is Ctrl-C to every process of the job, as the
            # agent's own stop asks, then SIGKILL to whatever is left once the timeout passes.
            ("KillMode", "control-group"),
            ("KillSignal", "SIGINT"),
            ("SendSIGKILL", "yes"),
            ("TimeoutStopSec", f"{self.stop_timeout_seconds:g}s"),
        ]
        identity = [
            ("User", account.pw_name),
            ("Group", grp.getgrgid(account.pw_gid).gr_name),
            ("WorkingDirectory", str(cwd)),
        ]
        rows = [*identity, *((d.name, d.value) for d in SANDBOX), *stop]
        return [f"--property={name}={value}" for name, value in rows]

    def command(self, program: Path, *, job: str, cwd: Path, account: pwd.struct_passwd) -> list[str]:
        """`program` as the service of `job` (an id), as the account; systemd-run's own output and input
        are the service's (--pipe), and it waits for the service to end (--wait), so the runner is
        watched as a child. --collect unloads the service even when it failed."""
        return [
            str(self.systemd_run),
            f"--unit={self.name(job)}",
            f"--slice={SLICE}",
            "--service-type=exec",
            "--collect",
            "--pipe",
            "--wait",
            "--quiet",
            *self.properties(account, cwd),
            "--",
            str(program),
        ]
