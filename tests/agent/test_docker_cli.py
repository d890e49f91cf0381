"""The docker CLI as the scrub runs it, each command as docker's reference documents it (agent/docker.py),
without a daemon: the commands are recorded and answered as docker answers them."""

from __future__ import annotations

import subprocess
from typing import Any

from agent.docker import DockerCli

SYSTEM_DF = "Images\t3\nContainers\t0\nLocal Volumes\t1\nBuild Cache\t14\n"
"""`docker system df --format '{{.Type}}\\t{{.TotalCount}}'` on a daemon that has built something."""


class RecordedDocker:
    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers
        self.commands: list[list[str]] = []

    def __call__(self, argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        self.commands.append(argv)
        return subprocess.CompletedProcess(argv, 0, self.answers.get(" ".join(argv[1:3]), ""), "")


def test_the_build_cache_is_counted_from_system_df_and_pruned_whole() -> None:
    # Given a daemon whose BuildKit cache holds 14 records
    docker = RecordedDocker({"system df": SYSTEM_DF})
    cli = DockerCli(60, run=docker)

    # When the scrub counts and prunes it / Then it reads the count, and prunes all of it without asking
    assert cli.build_cache_records() == 14
    cli.prune_build_cache()
    assert docker.commands == [
        ["docker", "system", "df", "--format", "{{.Type}}\t{{.TotalCount}}"],
        ["docker", "builder", "prune", "--all", "--force"],
    ]


def test_a_daemon_that_reports_no_build_cache_line_has_none() -> None:
    # Given a daemon without BuildKit's cache in its report (an engine built without it)
    cli = DockerCli(60, run=RecordedDocker({"system df": "Images\t1\nContainers\t0\n"}))
    # Then there is nothing to prune
    assert cli.build_cache_records() == 0
