"""How long a runner takes to be listening, segment by segment, from published measurements.

Each segment is a triangular distribution (min, mode, max, in seconds) with the source it comes from;
a path (hot, stopped, cold with a boot-time install, cold from a baked image) is the sum of its
segments. `make bench`'s day trace (bench/day_trace.py) draws from it in simulated time; the emulator's
simulated instances may draw their boot delay from it, compressed (`compressed_boot_delays`).

Published end-to-end figures the paths are checked against (tests/integration/test_boot_model.py):

- RunsOn, "Runner pools" (https://runs-on.com/runners/pools): queued→started on Linux under 25 s
  cold-start (their images are prepared), under 15 s from a stopped instance, under 6 s from a hot one.
- Depot, "Making EC2 boot time 8x faster" (https://depot.dev/blog/faster-ec2-boot-time, May 2024): an
  EC2 boot of about 40 s cut to about 5 s with a prepared image started from a stopped, pre-warmed
  volume.
- terraform-aws-github-runner: its users report cold runners taking 1.5 to 4 minutes with the runner
  installed at boot (#4076 "minimum_running_time_in_minutes": "the full time period of the boot-up
  takes around 5 minutes" on Ubuntu), and 45-60 s from a custom AMI with the runner baked in, half
  of it starting the runner (#4637 "Startup time for custom AMI").
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum


@dataclass(frozen=True)
class Segment:
    """One step on a runner's way to listening: a triangular distribution of seconds, and its source."""

    name: str
    low: float
    mode: float
    high: float
    source: str

    def __post_init__(self) -> None:
        if not 0 <= self.low <= self.mode <= self.high:
            raise ValueError(f"segment {self.name}: need 0 <= low <= mode <= high")

    def draw(self, rng: random.Random) -> float:
        if self.low == self.high:
            return self.low
        return rng.triangular(self.low, self.high, self.mode)

    def quantile(self, q: float) -> float:
        """The inverse of the triangular distribution's CDF at `q` (0..1)."""
        low, mode, high = self.low, self.mode, self.high
        if low == high:
            return low
        split = (mode - low) / (high - low)
        if q < split:
            return low + math.sqrt(q * (high - low) * (mode - low))
        return high - math.sqrt((1 - q) * (high - low) * (high - mode))

    def fixed(self, seconds: float) -> Segment:
        """The same segment taking exactly `seconds`: for tests that check arithmetic, not chance."""
        return Segment(self.name, seconds, seconds, seconds, self.source)


CONTROL_PLANE = Segment(
    "control plane: webhook to a claimed or launched instance",
    1.0,
    1.7,
    5.0,
    # Our own emulator measures the control plane's share of a warm pickup at 1.7 s median, 2.0 s p95
    # (bench/results.json, emulator_warm_control_plane_*); GitHub's webhooks are "best effort" and
    # "can be delayed by several seconds" (Depot, "Breaking the five second barrier",
    # https://depot.dev/blog/github-actions-breaking-five-second-barrier).
    "bench/results.json emulator_warm_control_plane_*; "
    "depot.dev/blog/github-actions-breaking-five-second-barrier",
)
LAUNCH = Segment(
    "EC2 launch: CreateFleet to running (pending)",
    5.0,
    12.0,
    30.0,
    # ec2-boot-bench (Colin Percival, "EC2 boot time benchmarking", daemonology.net, 2021-08-12): the
    # RunInstances call 1.5 s and pending→running 4.9 s on c5.xlarge; brevdev/ec2-coldboot-research
    # (@fix_plan.md) measures API ~5 s and pending→running 16.4-16.6 s for m7i/c7i/r7i.large, "instance
    # type doesn't matter"; an encrypted EBS root slows the launch (martysweet.co.uk, "EC2 Launch Times",
    # October 2023).
    "daemonology.net/blog/2021-08-12-EC2-boot-time-benchmarking.html; "
    "github.com/brevdev/ec2-coldboot-research",
)
OS_BOOT = Segment(
    "OS boot: running to user data (cloud-init) starting the agent",
    3.0,
    6.0,
    20.0,
    # brevdev/ec2-coldboot-research: boot→SSH 3.2 s with cloud-init; ec2-boot-bench: running→port
    # closed 17 s on the 2021 Linux AMIs; "Amazon Linux 2023 is the fastest general-purpose AMI to boot"
    # (martysweet.co.uk, "EC2 Launch Times").
    "github.com/brevdev/ec2-coldboot-research; martysweet.co.uk/ec2-launch-times",
)
INSTALL = Segment(
    "boot-time install: OS packages, the runner (~150 MB unpacked, checksum), the agent's wheelhouse",
    45.0,
    90.0,
    200.0,
    # No one publishes this step alone; it is what is left of terraform-aws-github-runner's users'
    # 1.5-4 min cold starts (issue #4076: about 5 minutes on Ubuntu) once the launch, the OS boot and
    # the runner's start (baked AMI: 45-60 s in all, issue #4637) are taken out.
    "github.com/github-aws-runners/terraform-aws-github-runner issues #4076, #4637 (less the other segments)",
)
BAKED_START = Segment(
    "baked image: configure and start the agent (nothing to install)",
    2.0,
    4.0,
    10.0,
    # Depot boots a prepared image to a running agent in about 5 s in all
    # (depot.dev/blog/faster-ec2-boot-time); RunsOn's prepared images are queued→started under 25 s
    # cold (runs-on.com/runners/pools).
    "depot.dev/blog/faster-ec2-boot-time; runs-on.com/runners/pools",
)
START = Segment(
    "StartInstances: stopped to running",
    3.0,
    6.0,
    12.0,
    # RunsOn: a stopped pool serves a job queued→started under 15 s; Depot starts pre-warmed stopped
    # instances ("launch, prepare basic software, shut down ... the stopped VM is then started",
    # news.ycombinator.com/item?id=39935460) for its ~5 s boot.
    "runs-on.com/runners/pools; depot.dev/blog/faster-ec2-boot-time",
)
RESUME = Segment(
    "resume: OS boot on a warmed volume, the agent's fresh heartbeat",
    2.0,
    3.0,
    6.0,
    # A restarted instance boots from its own, already hydrated EBS volume: "later boots on the same
    # volume are much faster" than the first (Depot, faster-ec2-boot-time; its HN discussion).
    "depot.dev/blog/faster-ec2-boot-time",
)
REGISTRATION = Segment(
    "JIT runner: the agent starts the runner with its config, listening for the job",
    1.5,
    3.0,
    8.0,
    # RunsOn's hot instances start a job under 6 s from queued in all; "GitHub's own runner startup and
    # job assignment can add ~8-10 s" (HN discussion of Depot's post, hndistilled.com/story/40455208).
    "runs-on.com/runners/pools; hndistilled.com/story/40455208",
)


class Path(StrEnum):
    """Where a job's runner comes from."""

    HOT = "hot"
    STOPPED = "stopped"
    COLD_INSTALL = "cold, install at boot"
    COLD_BAKED = "cold, baked image"


@dataclass(frozen=True)
class BootModel:
    """Every segment, replaceable one by one (tests fix them to exact seconds)."""

    control_plane: Segment = CONTROL_PLANE
    launch: Segment = LAUNCH
    os_boot: Segment = OS_BOOT
    install: Segment = INSTALL
    baked_start: Segment = BAKED_START
    start: Segment = START
    resume: Segment = RESUME
    registration: Segment = REGISTRATION

    def to_running(self, path: Path) -> tuple[Segment, ...]:
        """The segments from the control plane's call to EC2 until EC2 bills the instance (running)."""
        if path is Path.HOT:
            return ()
        if path is Path.STOPPED:
            return (self.start,)
        return (self.launch,)

    def running_to_agent(self, path: Path) -> tuple[Segment, ...]:
        """From running until the agent is up and beating (a pool instance is admitted after this)."""
        if path is Path.HOT:
            return ()
        if path is Path.STOPPED:
            return (self.resume,)
        return (self.os_boot, self.baked_start if path is Path.COLD_BAKED else self.install)

    def segments(self, path: Path) -> tuple[Segment, ...]:
        """Every segment from a job queued to its runner listening, on `path`."""
        return (
            self.control_plane,
            *self.to_running(path),
            *self.running_to_agent(path),
            self.registration,
        )

    def draw(self, path: Path, rng: random.Random) -> float:
        return sum(segment.draw(rng) for segment in self.segments(path))

    def percentiles(self, path: Path, draws: int = 20_000, seed: int = 16) -> tuple[float, float]:
        """Queued→listening p50 and p95 on `path`, by drawing (a sum of triangles has no closed form)."""
        rng = random.Random(seed)  # noqa: S311 - a seeded simulation, not a secret
        totals = sorted(self.draw(path, rng) for _ in range(draws))
        return totals[draws // 2], totals[int(draws * 0.95)]

    def fixed(self, **seconds: float) -> BootModel:
        """This model with the named segments taking exactly the given seconds."""
        return replace(self, **{name: getattr(self, name).fixed(value) for name, value in seconds.items()})


def compressed_boot_delays(
    baked: bool, scale: float, seed: int = 16, model: BootModel | None = None
) -> Callable[[], float]:
    """Boot delays for the emulator's simulated instances: launch to the agent starting, times `scale`.

    The emulator runs our real agent, so the runner's registration is its own and not drawn here.
    """
    model = model or BootModel()
    path = Path.COLD_BAKED if baked else Path.COLD_INSTALL
    rng = random.Random(seed)  # noqa: S311 - a seeded simulation, not a secret
    segments = (*model.to_running(path), *model.running_to_agent(path))

    def delay() -> float:
        return scale * sum(segment.draw(rng) for segment in segments)

    return delay
