"""The boot model (emulator/boot_model.py) against the published end-to-end figures its segments come from."""

from __future__ import annotations

import random
from typing import Any

import boto3
import pytest
from moto import mock_aws

from emulator.aws import REGION
from emulator.boot_model import BootModel, Path, Segment, compressed_boot_delays
from emulator.simulated_instances import InstanceSettings, SimulatedInstances
from emulator.timeline import Timeline

MODEL = BootModel()


def test_a_cold_start_with_a_boot_time_install_takes_what_terraform_module_users_report() -> None:
    # Given the published "1.5 to 4 minutes cold" of terraform-aws-github-runner's users (runner
    # installed at boot; issue 16's survey, and issue #4076 of that repository)
    # When the cold path with an install is drawn / Then its median and p95 fall in that range
    p50, p95 = MODEL.percentiles(Path.COLD_INSTALL)
    assert 90 <= p50 <= 240
    assert p95 <= 240


def test_a_baked_image_cuts_the_cold_start_to_what_a_baked_ami_takes() -> None:
    # Given a baked AMI's 45-60 s launch to runner (terraform-aws-github-runner #4637), RunsOn's prepared
    # images under 25 s queued→started, and Depot's ~5 s boot of a prepared, pre-warmed image
    p50, p95 = MODEL.percentiles(Path.COLD_BAKED)
    # Then the baked path is between the best published figure and a baked AMI's worst
    assert 25 <= p50 <= 60
    assert p95 <= 60
    # And it saves more than a minute at the median over installing at boot
    assert MODEL.percentiles(Path.COLD_INSTALL)[0] - p50 > 60


def test_stopped_and_hot_pools_are_near_runs_ons_published_queue_times() -> None:
    # Given RunsOn's Linux queue times: stopped under 15 s, hot under 6 s (runs-on.com/runners/pools);
    # ours add GitHub's webhook and our control plane (CONTROL_PLANE), which theirs may not count
    stopped_p50, stopped_p95 = MODEL.percentiles(Path.STOPPED)
    hot_p50, hot_p95 = MODEL.percentiles(Path.HOT)
    # Then each is within 1.5 times the published bound at the median
    assert stopped_p50 <= 1.5 * 15
    assert hot_p50 <= 1.5 * 6
    # And the paths are ordered: hot < stopped < cold baked < cold install, at p50 and at p95
    ordered = [
        MODEL.percentiles(path) for path in (Path.HOT, Path.STOPPED, Path.COLD_BAKED, Path.COLD_INSTALL)
    ]
    assert ordered == sorted(ordered)
    assert hot_p95 < stopped_p95


def test_a_triangular_segments_quantiles_match_its_draws() -> None:
    # Given a skewed segment
    segment = Segment("s", 2.0, 3.0, 12.0, "test")
    rng = random.Random(1)
    # When drawn many times
    draws = sorted(segment.draw(rng) for _ in range(20_000))
    # Then its analytic quantiles match the drawn ones, and every draw is within its bounds
    for q in (0.05, 0.5, 0.95):
        assert draws[int(q * len(draws))] == pytest.approx(segment.quantile(q), abs=0.15)
    assert draws[0] >= 2.0
    assert draws[-1] <= 12.0


def test_a_fixed_model_takes_exactly_the_sum_of_its_segments() -> None:
    # Given every segment of the stopped path fixed
    model = MODEL.fixed(control_plane=1, start=5, resume=3, registration=2)
    # When drawn / Then the path is their sum, whatever the generator
    assert model.draw(Path.STOPPED, random.Random(7)) == 11
    assert [s.name for s in model.segments(Path.HOT)] == [MODEL.control_plane.name, MODEL.registration.name]


def test_compressed_boot_delays_scale_the_launch_to_agent_segments() -> None:
    # Given a model whose cold baked launch-to-agent segments are fixed: 10 + 4 + 2 s
    model = MODEL.fixed(launch=10, os_boot=4, baked_start=2, install=100)
    # When the emulator draws compressed boot delays / Then they are that sum, scaled
    assert compressed_boot_delays(baked=True, scale=0.1, model=model)() == pytest.approx(1.6)
    assert compressed_boot_delays(baked=False, scale=0.01, model=model)() == pytest.approx(1.14)


class _Aws:
    """Local AWS as the watcher uses it here: its EC2 client (the states it reads from EC2's backend)."""

    def __init__(self, ec2: Any) -> None:
        self._ec2 = ec2

    def client(self, _service: str) -> Any:
        return self._ec2


def test_simulated_instances_draw_their_boot_delay_when_given_a_draw(tmp_path: Any) -> None:
    # Given simulated instances whose boot delays come from a draw
    settings = InstanceSettings(boot_delays=lambda: 123.0)
    with mock_aws():
        # (the watcher reads local EC2's backend: one running instance with the stack's tag)
        ec2 = boto3.client("ec2", region_name=REGION)
        image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        ec2.run_instances(
            ImageId=image,
            MinCount=1,
            MaxCount=1,
            TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": "stack", "Value": "s"}]}],
        )
        instances = SimulatedInstances(
            _Aws(ec2),  # type: ignore[arg-type]
            table_name="t",
            credentials_key_id="k",
            stack_tag=("stack", "s"),
            scratch=tmp_path,
            timeline=Timeline(),
            settings=settings,
        )
        # When the watcher first sees an instance
        instances.look()
    # Then it boots after the drawn delay, not the fixed default
    (seen,) = instances.instances().values()
    assert seen.boot_at - seen.launched_at == pytest.approx(123.0)
    assert InstanceSettings().boot_delay() == InstanceSettings().boot_delay_seconds
