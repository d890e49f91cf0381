"""A docker daemon in memory, behind the agent's Docker interface, refusing what the docker CLI refuses.

Each rule is docker's own, as its reference states it (the same citations as agent/docker.py):
a running container is removed only with --force; `rm --volumes` takes the container's anonymous
volumes and never a named one; a volume in use by a container cannot be removed, --force or not
(moby/moby#31450); a network with containers connected cannot be removed, nor a predefined one
(Engine API NetworkDelete: 403); an image is removed with --force unless a running container uses it
("image is being used by running container", which --force does not override); `builder prune --all`
takes every cache record no build is using (none runs once the containers are gone). Like the CLI given
several names, a removal tries each, then fails if any failed. A scrub that removes in the wrong
order, or forgets a kind, leaves something here and the test sees it.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from agent.docker import PREDEFINED_NETWORKS, DockerError, DockerImage

_ids = itertools.count(1)


def _new_id(kind: str) -> str:
    return "sha256:" + hashlib.sha256(f"{kind}-{next(_ids)}".encode()).hexdigest()


@dataclass
class FakeContainer:
    id: str
    image: str
    running: bool
    named_volumes: set[str]
    anonymous_volumes: set[str]
    networks: set[str]


@dataclass
class FakeDocker:
    images_by_id: dict[str, set[str]] = field(default_factory=dict)
    volume_names: set[str] = field(default_factory=set)
    network_names: set[str] = field(default_factory=lambda: set(PREDEFINED_NETWORKS))
    running: dict[str, FakeContainer] = field(default_factory=dict)
    build_cache: set[str] = field(default_factory=set)
    calls: list[str] = field(default_factory=list)

    # --- what a job does, through the daemon -----------------------------------------------------

    def pull(self, reference: str) -> str:
        for image_id, references in self.images_by_id.items():
            if reference in references:
                return image_id
        image_id = _new_id("image")
        self.images_by_id[image_id] = {reference}
        return image_id

    def create_volume(self, name: str) -> str:
        self.volume_names.add(name)
        return name

    def create_network(self, name: str) -> str:
        self.network_names.add(name)
        return name

    def run(
        self,
        reference: str,
        *,
        volumes: Sequence[str] = (),
        network: str = "bridge",
        anonymous_volume: bool = True,
    ) -> str:
        """`docker run`: pulls what is missing, creates named volumes it mounts, one anonymous volume."""
        image = self.pull(reference)
        for name in volumes:
            self.create_volume(name)
        anonymous = {_new_id("volume")[7:]} if anonymous_volume else set()
        self.volume_names |= anonymous
        if network not in self.network_names:
            raise DockerError(f"network {network} not found")
        container = FakeContainer(_new_id("container")[7:], image, True, set(volumes), anonymous, {network})
        self.running[container.id] = container
        return container.id

    def build(self, tag: str, steps: int = 3) -> str:
        """`docker build` through BuildKit: an image, and a cache record per step that later builds reuse."""
        self.build_cache |= {_new_id("cache")[7:] for _ in range(steps)}
        return self.pull(tag)

    # --- the agent's Docker interface ------------------------------------------------------------

    def containers(self) -> list[str]:
        self.calls.append("container ls")
        return list(self.running)

    def remove_containers(self, ids: Sequence[str]) -> None:
        self.calls.append("container rm --force --volumes")
        for container_id in ids:
            container = self.running.pop(container_id)
            self.volume_names -= container.anonymous_volumes

    def volumes(self) -> list[str]:
        self.calls.append("volume ls")
        return sorted(self.volume_names)

    def remove_volumes(self, names: Sequence[str]) -> None:
        self.calls.append("volume rm --force")
        self._each(names, self._remove_volume)

    def networks(self) -> list[str]:
        self.calls.append("network ls")
        return sorted(self.network_names - PREDEFINED_NETWORKS)

    def remove_networks(self, names: Sequence[str]) -> None:
        self.calls.append("network rm")
        self._each(names, self._remove_network)

    def images(self) -> list[DockerImage]:
        self.calls.append("image ls")
        return [DockerImage(image_id, frozenset(refs)) for image_id, refs in self.images_by_id.items()]

    def remove_images(self, ids: Sequence[str]) -> None:
        self.calls.append("image rm --force")
        self._each(ids, self._remove_image)

    def build_cache_records(self) -> int:
        self.calls.append("system df")
        return len(self.build_cache)

    def prune_build_cache(self) -> None:
        self.calls.append("builder prune --all --force")
        self.build_cache.clear()

    # --- docker's rules ---------------------------------------------------------------------------

    def _remove_volume(self, name: str) -> None:
        if any(name in c.named_volumes | c.anonymous_volumes for c in self.running.values()):
            raise DockerError(f"remove {name}: volume is in use")
        self.volume_names.discard(name)

    def _remove_network(self, name: str) -> None:
        if name in PREDEFINED_NETWORKS:
            raise DockerError(f"{name} is a pre-defined network and cannot be removed")
        if any(name in c.networks for c in self.running.values()):
            raise DockerError(f"error while removing network: network {name} has active endpoints")
        self.network_names.discard(name)

    def _remove_image(self, image_id: str) -> None:
        if any(c.image == image_id and c.running for c in self.running.values()):
            raise DockerError(
                f"conflict: unable to delete {image_id[:19]} (cannot be forced) - image is being used"
            )
        self.images_by_id.pop(image_id, None)

    @staticmethod
    def _each(names: Sequence[str], remove: Callable[[str], None]) -> None:
        failures = []
        for name in names:
            try:
                remove(name)
            except DockerError as exc:
                failures.append(str(exc))
        if failures:
            raise DockerError("; ".join(failures))
