"""The instance metadata service of every simulated instance, IMDSv2 only, on one loopback port.

Each instance's agent is given `http://127.0.0.1:<port>/<instance id>` as its metadata endpoint, so
one server answers for all of them and tells them apart by that first path segment. Like EC2's, it
answers only requests that carry a session token obtained with a PUT (IMDSv1 is refused).

EC2's notices to a spot instance are items of its metadata, absent (404) until EC2 gives one:

- `spot/instance-action`: `{"action": "terminate", "time": "<UTC>"}`, the action (`hibernate`, `stop` or
  `terminate`) and the approximate time it happens, from the interruption warning on (EC2 User Guide, "Spot
  Instance interruption notices", section "instance-action");
- `events/recommendations/rebalance`: `{"noticeTime": "<UTC>"}`, when the rebalance recommendation was
  given (EC2 User Guide, "EC2 instance rebalance recommendations", section "Use instance metadata").

`notify` posts one; emulator/ec2_events.py `SpotReclaim` posts them as it warns.
"""

from __future__ import annotations

import json
import secrets
import threading

from emulator.aws import ACCOUNT, REGION
from emulator.listening import LoopbackHandler, LoopbackServer

TOKEN_PATH = "/latest/api/token"  # noqa: S105 - a URL path, not a secret
IDENTITY_PATH = "/latest/dynamic/instance-identity/document"
PARTITION_PATH = "/latest/meta-data/services/partition"
INSTANCE_ACTION_PATH = "/latest/meta-data/spot/instance-action"
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
NOTICE_PATHS = (INSTANCE_ACTION_PATH, REBALANCE_PATH)


class InstanceMetadata(LoopbackServer):
    def __init__(self, region: str = REGION, account_id: str = ACCOUNT) -> None:
        super().__init__(_MetadataHandler, name="imds", poll_seconds=0.05)
        self.region = region
        self.account_id = account_id
        self.token = secrets.token_hex(16)
        self._notices: dict[tuple[str, str], str] = {}
        self._notices_lock = threading.Lock()

    def endpoint(self, instance_id: str) -> str:
        """The metadata endpoint to give the agent of `instance_id`."""
        return f"{self.origin}/{instance_id}"

    def notify(self, instance_id: str, path: str, item: dict[str, str]) -> None:
        """EC2 gives `instance_id` a notice: from now on its metadata has `item` at `path` (NOTICE_PATHS)."""
        if path not in NOTICE_PATHS:
            raise ValueError(f"{path} is not a notice EC2 gives in instance metadata")
        with self._notices_lock:
            self._notices[(instance_id, path)] = json.dumps(item)

    def answer(self, instance_id: str, path: str) -> str | None:
        with self._notices_lock:
            notice = self._notices.get((instance_id, path))
        if notice is not None:
            return notice
        answers = {
            IDENTITY_PATH: json.dumps(
                {"instanceId": instance_id, "region": self.region, "accountId": self.account_id}
            ),
            PARTITION_PATH: "aws",
        }
        return answers.get(path)


class _MetadataHandler(LoopbackHandler):
    server: InstanceMetadata

    def do_PUT(self) -> None:
        _, path = self._split()
        if path != TOKEN_PATH or self.headers.get("X-aws-ec2-metadata-token-ttl-seconds") is None:
            self._reply(400, "")
            return
        self._reply(200, self.server.token)

    def do_GET(self) -> None:
        if self.headers.get("X-aws-ec2-metadata-token") != self.server.token:
            self._reply(401, "")
            return
        instance_id, path = self._split()
        body = self.server.answer(instance_id, path)
        self._reply(404 if body is None else 200, body or "")

    def _split(self) -> tuple[str, str]:
        """(instance id, the metadata path below it)."""
        _, instance_id, rest = self.path.split("/", 2) if self.path.count("/") >= 2 else ("", "", "")
        return instance_id, "/" + rest

    def _reply(self, status: int, body: str) -> None:
        self.reply(status, (), body.encode())
