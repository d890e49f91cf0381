"""Runs uv for the synth's builds (the layer, the agent's wheelhouse), whatever the caller's environment.

What uv writes to a file must not depend on who runs the synth. The CDK CLI runs the app with
`FORCE_COLOR=0` in its environment, and uv follows force-color.org, where the variable's presence,
whatever its value, forces colour: `uv export` then writes ANSI colour codes into the requirements
file the layer is installed from, and `npx aws-cdk@2 deploy` fails on a fresh clone. So every build
call asks for no colour three ways (`--color never`, `NO_COLOR`, and no `FORCE_COLOR` or
`CLICOLOR_FORCE`), shows no progress, and reads no user or system `uv.toml` (`UV_NO_CONFIG`: the
build's arguments say everything it needs; a user's index or resolution settings must not change
what is built, and the lock's hashes refuse what differs anyway).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

COLOUR_FORCING = ("FORCE_COLOR", "CLICOLOR_FORCE", "UV_FORCE_COLOR")
"""Variables by which a caller forces colour whatever their value (force-color.org, bixense.com/clicolors)."""


class UvMissingError(RuntimeError):
    """uv is not on this machine; the message says how to get it."""


def uv_command(arguments: Sequence[str]) -> list[str]:
    """The uv command line for a build: `uv --color never <arguments>`."""
    # `uv run` names itself in $UV; otherwise whichever uv is on PATH.
    uv = os.environ.get("UV") or shutil.which("uv") or "uv"
    return [uv, "--color", "never", "--no-progress", *arguments]


def build_environment(caller: Mapping[str, str]) -> dict[str, str]:
    """The caller's environment without what would change what uv writes to a file."""
    environment = {name: value for name, value in caller.items() if name not in COLOUR_FORCING}
    environment.update(NO_COLOR="1", UV_NO_PROGRESS="1", UV_NO_CONFIG="1")
    return environment


def run_uv(arguments: Sequence[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Runs uv in `cwd` with the build's environment; what it printed comes back, never raised on."""
    try:
        return subprocess.run(  # noqa: S603 - uv, with arguments built by the synth
            uv_command(arguments),
            cwd=cwd,
            env=build_environment(os.environ),
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError:
        raise UvMissingError(
            "uv is not installed; run `make synth` (it installs uv) or install uv (https://docs.astral.sh/uv/)"
        ) from None
