"""Local EC2 with the public images the product looks up, not the 1,300 moto loads by default.

moto builds an image object for each of its default public AMIs every time it creates an EC2
backend (each `mock_aws`, each reset): about 1,300 for us-east-1, 1,227 of them ECS-optimized images
we never use. That was ~10% of an integration test's time. moto's documented `MOTO_AMIS_PATH`
(docs.getmoto.org, EC2 "AMIs"; getmoto/moto#5677: the file's AMIs replace the defaults) loads a file
instead: here moto's own default list plus this region's latest Amazon Linux images, which
emulator/resources.py picks the launch templates' images from.

moto reads the variable when it first imports its EC2 images module, so `use_the_images_we_look_up()`
runs when the `emulator` package is imported, before anything creates an EC2 backend; if moto's EC2
was imported first it leaves moto as it is.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

AMIS_VARIABLE = "MOTO_AMIS_PATH"
_IMAGES_MODULE = "moto.ec2.models.amis"


def use_the_images_we_look_up(region: str) -> Path | None:
    """Point moto at a file of the images the emulator uses; the file, or None if moto was too far on."""
    if AMIS_VARIABLE in os.environ or _IMAGES_MODULE in sys.modules:
        return None
    path = Path(tempfile.gettempdir()) / f"runner-pool-moto-{version('moto')}-amis-{region}.json"
    if not path.exists():
        # moto only here, where the file is made: every process that imports the emulator runs this, each
        # simulated instance's agent among them (emulator/iam_agent.py), and most never touch moto.
        from moto.utilities.utils import load_resource  # noqa: PLC0415

        images = load_resource("ec2/resources/amis.json") + load_resource(
            f"ec2/resources/latest_amis/{region}.json"
        )
        # Written beside and renamed over, so a parallel test worker never reads half a file.
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as handle:
            json.dump(images, handle)
        os.replace(handle.name, path)
    os.environ[AMIS_VARIABLE] = str(path)
    return path
