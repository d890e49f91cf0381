"""The CDK app's entry point, run by `make synth` and by the CDK CLI through cdk.json."""

from __future__ import annotations

import os
import sys

# jsii reads this when its Node process starts, on the first import of aws_cdk; the Makefile sets it
# too, but the CDK CLI runs this file without the Makefile.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from infra.app import PROJECT_ROOT, build_app
from infra.dependency_layer import LayerBuildError
from runner_pool.domain.config import ConfigError


def main() -> None:
    # The CDK CLI says where the assembly goes; run directly, it lands in cdk.out/ as with `cdk synth`.
    outdir = None if os.environ.get("CDK_OUTDIR") else str(PROJECT_ROOT / "cdk.out")
    try:
        app = build_app(outdir=outdir)
    except (ConfigError, LayerBuildError) as error:
        sys.exit(f"cdk synth failed: {error}")
    try:
        app.synth()
    except RuntimeError as error:
        # cdk-nag's findings are already printed above; a jsii stack trace under them adds nothing.
        if not str(error).startswith("ValidationFailed"):
            raise
        sys.exit(f"cdk synth failed: {error}")


if __name__ == "__main__":
    main()
