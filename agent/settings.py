"""The agent's settings: written by the user data into /etc/runner-pool/agent.env, validated at start."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_FILE = Path("/etc/runner-pool/agent.env")
ENV_PREFIX = "RUNNER_POOL_"


class AgentSettings(BaseSettings):
    """Every setting is `RUNNER_POOL_<NAME>` in the environment or in ENV_FILE; the environment wins."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_file=ENV_FILE, extra="ignore", frozen=True)

    table_name: str = Field(min_length=1)
    credentials_key_id: str | None = None
    """The runner credentials key; when set, a config encrypted under any other key is refused."""
    region: str | None = None
    """Defaults to the instance's own region, from the instance metadata."""
    imds_endpoint: str = "http://169.254.169.254"

    notice_queue_url_prefix: str | None = None
    """The stack's notice queue URLs up to the instance id (runner_pool.domain.notices): the agent
    long-polls its own and reads its record the moment a notice arrives. Unset, it reads its record
    every watch period only."""
    notice_wait_seconds: int = Field(20, ge=1, le=20)
    """Each ReceiveMessage's long-poll wait: SQS's longest, 20 s, is the cheapest (Amazon SQS Developer
    Guide, "Amazon SQS short and long polling")."""
    heartbeat_period_seconds: float = Field(30, gt=0)
    watch_period_seconds: float = Field(15, gt=0)
    """The longest the agent goes without reading its own record: what a lost notice can cost a claim
    (less than the control plane's claim_registration_seconds), and, without notices, how long a claim
    waits for the agent to see it."""
    watch_backoff_cap_seconds: float = Field(30, gt=0)
    termination_grace_seconds: float = Field(300, ge=0)
    """How long after its threshold the agent terminates its own instance, if the control plane has not."""
    orphan_grace_seconds: float = Field(900, gt=0)
    """How long the agent waits for a record of its instance before it concludes nobody owns it."""
    retention_days: int = Field(7, gt=0)

    log_group_name: str | None = None
    """The stack's log group of job logs (domain/job_logs.py): the agent ships its lines and the runner's
    diagnostic logs there. Unset, nothing leaves the instance's journal."""
    log_ship_period_seconds: float = Field(5, gt=0)
    """How often the agent's lines are sent: a PutLogEvents call per stream at most every period."""
    log_flush_seconds: float = Field(10, ge=0)
    """How long a release waits for the runner's diagnostic lines to be sent before its scrub goes on
    anyway (well inside the control plane's release receipt timeout, 120 s by default)."""

    runner_dir: Path = Path("/opt/actions-runner")
    runner_program: Path | None = None
    """The runner's start script; `run.sh` in the runner directory unless set."""
    work_dir: Path | None = None
    """The runner's work folder; `_work` in the runner directory unless set."""
    runner_user: str | None = None
    """The account the runner (and so every job) runs as; the agent's own when unset. Only an account
    of its own is scrubbed back to its first boot between jobs (agent/scrub.py)."""
    runner_manifest: Path | None = None
    """The runner's files as installed (agent/runner_install.py): checked before each start and after
    each job. Unset (as in the emulator), the runner directory is trusted."""
    job_unit: str | None = None
    """The name (before each job's id) of the transient systemd service each job's runner runs in,
    sandboxed (agent/sandbox.py); its slice's cgroup is the job's, and job_cgroup is not used. Unset
    (the emulator, the tests, a host without systemd), the runner is the agent's own child, unsandboxed."""
    systemd_run: Path = Path("/usr/bin/systemd-run")
    """What starts the runner's service, when job_unit is set."""
    job_cgroup: str | None = None
    """A cgroup v2 directory, relative to the agent's own cgroup, that the runner starts in: whatever
    the job starts (under any uid, through sudo too) stays in it and is killed with it. Needs the agent's
    unit to delegate its cgroup (systemd Delegate=yes)."""
    cgroup_root: Path = Path("/sys/fs/cgroup")

    home_skeleton: Path = Path("/etc/skel")
    """What the runner account's home holds at first boot (useradd copies it): the home is reset to it."""
    temp_dirs: tuple[Path, ...] = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"))  # noqa: S108
    """Shared writable directories: whatever the runner account owns in them is removed."""
    crontab_dirs: tuple[Path, ...] = (Path("/var/spool/cron/crontabs"), Path("/var/spool/cron"))
    """Where crontab(1) keeps a user's table: Debian's cron and cronie (Amazon Linux) respectively."""
    linger_dir: Path = Path("/var/lib/systemd/linger")
    """systemd-logind's lingering markers (loginctl enable-linger): one file per user."""
    mail_dirs: tuple[Path, ...] = (Path("/var/spool/mail"), Path("/var/mail"))
    """Mail spools: useradd may create the account's (CREATE_MAIL_SPOOL); it is emptied, not removed."""
    scan_roots: tuple[Path, ...] = (Path("/"),)
    """Searched, one file system each, for anything the runner account still owns after the scrub."""
    scan_exclude: tuple[Path, ...] = (
        Path("/proc"),
        Path("/sys"),
        Path("/dev"),
        Path("/var/lib/docker"),
        Path("/var/lib/containerd"),
    )
    """Not searched: kernel views, and image layers whose files may carry any uid (docker is checked
    through its daemon instead)."""
    mqueue_dir: Path = Path("/dev/mqueue")
    """Where the POSIX message queue file system is mounted (systemd mounts it there, dev-mqueue.mount):
    the runner account's queues are removed from it."""
    mountinfo: Path = Path("/proc/self/mountinfo")
    """The mount table the memory file systems (tmpfs) under the scan roots are found in."""
    subordinate_id_files: tuple[Path, ...] = (Path("/etc/subuid"), Path("/etc/subgid"))
    """A line for the runner account in either refuses the instance (subuid(5))."""
    first_user_uid: int = Field(1000, ge=1)
    """login.defs UID_MIN: a file of a uid from here up that no account has is a job's (a subordinate uid)."""
    docker_socket: Path = Path("/var/run/docker.sock")
    """No socket, no daemon: nothing of docker to clean."""
    passwd_file: Path = Path("/etc/passwd")
    """Where the account a Session Manager session creates is looked for (agent/operator_sessions.py)."""
    listening_timeout_seconds: float = Field(120, gt=0)
    stop_timeout_seconds: float = Field(30, gt=0)

    chronyc: Path | None = None
    """chrony's client, asked at boot how far the system clock may be from Amazon Time Sync
    (agent/clock_check.py); the user data names it. Unset, the clock is not checked: a test's host, whose
    clock is the control plane's own."""
    clock_error_bound_seconds: float = Field(1.0, gt=0)
    """The furthest the clock may be from true time for the instance to be used. The control plane reads
    the agent's times against its own clock: a heartbeat is stale past the healthy window (90 s, beats
    every 30 s: a margin of 60 s, which the config only requires to be positive), and a started instance
    is ready only on a beat written after its hand-over, a comparison with no margin, which a clock behind
    by d delays by d. One second keeps each of these within a second, a small part of any window or
    period; chrony synchronised to the link-local Amazon Time Sync endpoint stays far inside it."""
    clock_sync_wait_seconds: float = Field(60, ge=0)
    """How long a boot waits for chrony to synchronise the clock (its first updates step a clock that is
    far off) before the instance is refused."""

    pre_runner_script: Path | None = None
    pre_runner_timeout_seconds: float = Field(1800, gt=0)
    state_file: Path | None = Path("/var/lib/runner-pool/agent-state.json")
    """What the agent must remember across its own restarts; None keeps it in memory only."""

    docker_timeout_seconds: float = Field(60, gt=0)
    """Bounds each docker command of the scrub; well inside the release receipt timeout."""

    @property
    def runner_start_script(self) -> Path:
        return self.runner_program or self.runner_dir / "run.sh"

    @property
    def runner_work_dir(self) -> Path:
        return self.work_dir or self.runner_dir / "_work"
