"""Local EC2 loads the images the product looks up, not moto's ~1,300 defaults (emulator/moto_amis.py)."""

from __future__ import annotations

import os

from moto import mock_aws

from emulator.aws import REGION
from emulator.moto_amis import AMIS_VARIABLE
from emulator.resources import AMI_ARCHITECTURES, _amazon_linux_image


def test_local_ec2_holds_few_images_and_an_amazon_linux_image_for_each_architecture() -> None:
    # Given the emulator imported (it points moto at its file of images)
    assert AMIS_VARIABLE in os.environ
    with mock_aws():
        import boto3  # noqa: PLC0415

        ec2 = boto3.client("ec2", region_name=REGION)
        # When the images are listed
        images = ec2.describe_images(Owners=["amazon"])["Images"]
        # Then there are tens, not moto's ~1,300 defaults
        assert 10 < len(images) < 200, len(images)
        # And the launch templates' Amazon Linux 2023 image is found for every architecture we launch
        for architecture in AMI_ARCHITECTURES.values():
            assert _amazon_linux_image(ec2, architecture).startswith("ami-")
