"""What a job left in the docker daemon: containers, volumes, networks, pulled images and build cache,
and removing them.

The scrub talks to docker through the `Docker` interface; on an instance that is the docker CLI
(`DockerCli`), each command as docker's reference documents it (docs.docker.com/reference/cli/docker/):

- `docker container ls --all --quiet --no-trunc`: every container, running or not.
- `docker container rm --force --volumes`: "--force: Force the removal of a running container (uses
  SIGKILL)", "--volumes: Remove anonymous volumes associated with the container". A named volume is
  left ("if a volume was specified with a name, it will not be removed"), hence the next step.
- `docker volume rm --force`: "You can't remove a volume that's in use by a container", so after the
  containers; --force does not override that (moby/moby#31450).
- `docker network rm`: "you must first disconnect any containers connected to it", so after the
  containers. The predefined networks (bridge, host, none) cannot be removed (Engine API NetworkDelete:
  403 "operation not supported for pre-defined networks") and are never listed as the job's.
- `docker image rm --force`: "You cannot remove an image of a running container unless you use the -f
  option"; by id, so every tag of the image goes. Images in the operator's base set are kept.
- `docker builder prune --all --force`: "Remove build cache"; "--all: Remove all unused build cache, not
  just dangling ones", "--force: Do not prompt for confirmation". BuildKit's cache holds the layers and
  files of every build (a `COPY` of a secret too), and the next job's build would reuse them.
- `docker system df --format '{{.Type}}\t{{.TotalCount}}'`: the daemon's disk use by type, one of which is
  `Build Cache` ("Valid placeholders: .Type, .TotalCount, .Active, .Size, .Reclaimable"): the check that
  no cache record is left.

A job's buildx builders are its own account's: buildx keeps them in the client's configuration
(`~/.docker/buildx`, or `$DOCKER_CONFIG/buildx`: docs.docker.com/reference/cli/docker/buildx/), which
goes with the home (or the work directory) the scrub resets, and a `docker-container` builder runs as a
container `buildx_buildkit_<name>0` with its state in a volume, which go with the containers and
volumes. `docker buildx ls` run by the agent (root) would list root's builders, not the job's; so the
scrub does not call it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

PREDEFINED_NETWORKS = frozenset({"bridge", "host", "none"})


class DockerError(RuntimeError):
    """A docker command failed; the message says which and why."""


@dataclass(frozen=True)
class DockerImage:
    id: str
    references: frozenset[str]
    """`repository:tag` of each tag; empty for an untagged image."""

    def kept_by(self, base: frozenset[str]) -> bool:
        return self.id in base or bool(self.references & base)


class Docker(Protocol):
    def containers(self) -> list[str]: ...
    def remove_containers(self, ids: Sequence[str]) -> None: ...
    def volumes(self) -> list[str]: ...
    def remove_volumes(self, names: Sequence[str]) -> None: ...
    def networks(self) -> list[str]:
        """User-defined networks only: never the predefined ones."""
        ...

    def remove_networks(self, names: Sequence[str]) -> None: ...
    def images(self) -> list[DockerImage]: ...
    def remove_images(self, ids: Sequence[str]) -> None: ...
    def build_cache_records(self) -> int:
        """How many records BuildKit's build cache holds."""
        ...

    def prune_build_cache(self) -> None: ...


Run = Callable[..., "subprocess.CompletedProcess[str]"]


class DockerCli:
    """The docker CLI, run as root (the agent): it reaches the daemon through its socket."""

    def __init__(
        self, timeout_seconds: float, command: Sequence[str] = ("docker",), run: Run = subprocess.run
    ):
        self._timeout = timeout_seconds
        self._command = tuple(command)
        self._run = run

    def containers(self) -> list[str]:
        return self._lines("container", "ls", "--all", "--quiet", "--no-trunc")

    def remove_containers(self, ids: Sequence[str]) -> None:
        if ids:
            self._call("container", "rm", "--force", "--volumes", *ids)

    def volumes(self) -> list[str]:
        return self._lines("volume", "ls", "--quiet")

    def remove_volumes(self, names: Sequence[str]) -> None:
        if names:
            self._call("volume", "rm", "--force", *names)

    def networks(self) -> list[str]:
        return [
            name
            for name in self._lines("network", "ls", "--format", "{{.Name}}")
            if name not in PREDEFINED_NETWORKS
        ]

    def remove_networks(self, names: Sequence[str]) -> None:
        if names:
            self._call("network", "rm", *names)

    def images(self) -> list[DockerImage]:
        references: dict[str, set[str]] = {}
        for line in self._lines(
            "image", "ls", "--all", "--no-trunc", "--format", "{{.ID}} {{.Repository}}:{{.Tag}}"
        ):
            image_id, _, reference = line.partition(" ")
            tags = references.setdefault(image_id, set())
            if "<none>" not in reference:
                tags.add(reference)
        return [DockerImage(image_id, frozenset(tags)) for image_id, tags in references.items()]

    def remove_images(self, ids: Sequence[str]) -> None:
        if ids:
            self._call("image", "rm", "--force", *ids)

    def build_cache_records(self) -> int:
        for line in self._lines("system", "df", "--format", "{{.Type}}\t{{.TotalCount}}"):
            kind, _, count = line.partition("\t")
            if kind == "Build Cache":
                return int(count)
        return 0

    def prune_build_cache(self) -> None:
        self._call("builder", "prune", "--all", "--force")

    def _lines(self, *args: str) -> list[str]:
        return [line.strip() for line in self._call(*args).splitlines() if line.strip()]

    def _call(self, *args: str) -> str:
        argv = [*self._command, *args]
        try:
            result = self._run(argv, capture_output=True, text=True, timeout=self._timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DockerError(f"`docker {' '.join(args[:2])}` could not be run: {exc}") from exc
        if result.returncode != 0:
            detail = (result.stderr or result.stdout).strip().splitlines()
            raise DockerError(
                f"`docker {' '.join(args[:2])}` failed: {detail[-1] if detail else result.returncode}"
            )
        return result.stdout
