"""`python -m emulator.iam_agent SPEC`: the agent exactly as `python -m agent` runs it, with every AWS call
it makes checked against the synthesized instance role, as that instance (emulator/iam_check.py).

A simulated instance's agent is a process of its own, so its calls cannot be checked in the emulator's
process: this wrapper attaches the check to each client the agent's session makes, writes each denial
to SPEC's `denials` file the moment it happens (an instance may be killed, not stopped), and its calls
and grants used to the session's usage directory when the agent returns. `AgentCheckSpec` is what the
emulator writes for it; `collect_denials` reads the denials back into the emulator's check.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import boto3

from agent.__main__ import main as agent_main
from emulator.iam_check import CheckedCall, PolicyCheck, save_usage
from emulator.iam_stack import StackIam


@dataclass(frozen=True)
class AgentCheckSpec:
    template: str
    """A file holding the template the emulator checks against."""
    environment: dict[str, str]
    """What binds the instance role's resources (the state table, the credentials key)."""
    region: str
    account: str
    instance_id: str
    role: str
    """The logical id of the instance's role: its launch template's profile's (StackIam.instance_role),
    resolved by the emulator, whose check knows the local launch templates."""
    denials: str
    usage_directory: str | None

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self)))
        return path


class _ReportingCheck(PolicyCheck):
    """A check that writes each denied call to a file as it is found."""

    denials_file: Path

    def check(self, *args: Any, **kwargs: Any) -> CheckedCall:
        checked = super().check(*args, **kwargs)
        if not checked.allowed:
            with self.denials_file.open("a") as denials:
                denials.write(json.dumps(checked.explain()) + "\n")
        return checked


def main(spec_path: str) -> int:
    spec = AgentCheckSpec(**json.loads(Path(spec_path).read_text()))
    template = json.loads(Path(spec.template).read_text())
    check = _ReportingCheck(
        StackIam.bound(template, spec.environment, region=spec.region, account=spec.account)
    )
    check.denials_file = Path(spec.denials)
    principal = check.iam.of_role(spec.role, spec.instance_id)
    make_client = boto3.session.Session.client

    def checked_client(session: Any, *args: Any, **kwargs: Any) -> Any:
        return check.on_client(make_client(session, *args, **kwargs), principal)

    # The agent's entry point makes its clients from a boto3 Session (agent/__main__.py).
    boto3.session.Session.client = checked_client  # type: ignore[method-assign, assignment]
    try:
        return agent_main()
    finally:
        if spec.usage_directory:
            save_usage(check, spec.usage_directory)


def collect_denials(paths: list[Path]) -> list[str]:
    """Every denial the checked agents wrote."""
    return [json.loads(line) for path in paths if path.exists() for line in path.read_text().splitlines()]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
