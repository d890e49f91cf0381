"""Every AWS call a function or an agent makes, checked against the policy that would be deployed.

`PolicyCheck.on_client(client, principal)` attaches a botocore hook to a client: before each call is
sent, its IAM requests (emulator/iam_calls.py) are evaluated (emulator/iam_policy.py) against the
principal's statements in the synthesized template (emulator/iam_stack.py) and the resource's own
policy. A call the deployed policy would not allow is answered as AWS answers it (AccessDenied,
UnauthorizedOperation for EC2) without reaching local AWS, and noted: `assert_allowed()` then fails
with every denial, naming the action, the resource and the statement that is lacking.

Clients shared by several in-process functions (the local stack's functions share their clients) are
attached without a principal: each call is then checked against the principal of the function being
invoked on that thread, which `acting_as(principal)` sets around each invocation.
A call made outside any invocation is the test's own setup and is counted, not checked.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache, wraps
from pathlib import Path
from typing import Any

import boto3
from botocore.awsrequest import AWSResponse, HTTPHeaders
from botocore.exceptions import ClientError

from emulator.iam_calls import Authorization, LaunchInputs, authorizations
from emulator.iam_policy import Decision, Request, evaluate
from emulator.iam_stack import Principal, ResourcePolicy, StackIam

_log = logging.getLogger(__name__)

_acting: contextvars.ContextVar[Principal | None] = contextvars.ContextVar("iam_principal", default=None)
_DENIED_CODES = {"ec2": ("UnauthorizedOperation", 403), "sqs": ("AccessDenied", 403)}
"""The error each service answers a denied call with (EC2 API Reference "Error codes"; SQS API
Reference "Common errors"); the others answer AccessDeniedException, HTTP 400."""
_STASH = "runner_pool_iam_denial"
SECURE_TRANSPORT = {"aws:SecureTransport": "true"}
"""boto3 reaches AWS's endpoints over HTTPS, so every deployed call carries it (the queues' policies
deny calls without it)."""


class PolicyDeniedError(AssertionError):
    """The deployed policy would have denied calls a test made."""


@dataclass(frozen=True)
class CheckedCall:
    principal: str
    role: str
    operation: str
    decisions: tuple[Decision, ...]

    @property
    def allowed(self) -> bool:
        return all(decision.allowed for decision in self.decisions)

    def explain(self) -> str:
        denied = [d for d in self.decisions if not d.allowed]
        lines = [f"{self.principal} calls {self.operation}: denied"]
        for decision in denied:
            lines.append(f"  - {decision.explain()}")
            lines.append(f"    lacks: {_lacking(decision.request)}")
        return "\n".join(lines)


@dataclass
class PolicyCheck:
    iam: StackIam
    calls: list[CheckedCall] = field(default_factory=list)
    unchecked: int = 0
    """Calls made outside any function's invocation (a test's own setup)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _simulating: threading.local = field(default_factory=threading.local, repr=False)
    _resource_policies: dict[str, ResourcePolicy] = field(init=False, repr=False)
    _excused: dict[str, str] = field(default_factory=dict, repr=False)
    remote_denials: list[str] = field(default_factory=list)
    """Denials found in other processes (simulated instances' agents, emulator/iam_agent.py)."""
    observers: list[Callable[[str, Mapping[str, Any]], None]] = field(default_factory=list)
    """Told each checked call (`service:Operation`, its parameters) as it is made, in the caller's thread."""

    def __post_init__(self) -> None:
        self._resource_policies = self.iam.resource_policies()

    # --- attaching

    def on_client(self, client: Any, principal: Principal | None = None) -> Any:
        """Check every call `client` makes, as `principal` (None: the principal being invoked).

        A simulated EC2 (emulator/ec2_fleet.py) answers CreateFleet itself: that call is checked as
        it is made, and the simulator's own calls to local EC2 underneath it are not the caller's.
        """
        inner = getattr(client, "_client", client)
        lookups = _Lookups(self.iam, inner)
        inner.meta.events.register("provide-client-params", self._evaluator(principal, lookups))
        inner.meta.events.register("before-call", _answer_denied)
        if inner is not client and hasattr(client, "create_fleet"):
            client.create_fleet = self._simulated_create_fleet(client.create_fleet, principal, lookups)
        return client

    def on_stack_client(self, client: Any, principal: Any) -> None:
        """A `ClientHooks.on_client` callback for a local stack that names principals by their role's
        logical id in the template (`principal.role`, and `principal.instance_id` for an agent)."""
        self.on_client(client, self.iam.of_role(principal.role, principal.instance_id))

    def lookups(self, endpoint: str, region: str) -> Any:
        """What `check` needs to know of the AWS at `endpoint` (for calls made in another process)."""
        client = _session().client(
            "sts",
            region_name=region,
            endpoint_url=endpoint,
            aws_access_key_id="iam-check",
            aws_secret_access_key="iam-check",  # noqa: S106
        )
        return _Lookups(self.iam, client)

    @contextmanager
    def acting_as(self, principal: Principal) -> Iterator[None]:
        token = _acting.set(principal)
        try:
            yield
        finally:
            _acting.reset(token)

    # --- results

    def denials(self) -> list[CheckedCall]:
        with self._lock:
            return [call for call in self.calls if not call.allowed]

    def checked(self) -> int:
        with self._lock:
            return len(self.calls)

    def excuse(self, operation: str, reason: str) -> None:
        """Denials of `operation` (`ec2:TerminateInstances`) are what AWS answers in this test's scenario
        and the product meets them (`reason` says why): they no longer fail `assert_allowed`."""
        with self._lock:
            self._excused[operation] = reason

    def assert_allowed(self) -> None:
        with self._lock:
            excused = dict(self._excused)
        denied = [call.explain() for call in self.denials() if call.operation not in excused]
        with self._lock:
            denied += self.remote_denials
        if denied:
            unique = list(dict.fromkeys(denied))
            raise PolicyDeniedError(
                f"{len(denied)} AWS call(s) the synthesized stack's IAM policies would deny:\n"
                + "\n".join(unique)
            )

    # --- checking

    def check(
        self, principal: Principal, service: str, operation: str, params: Mapping[str, Any], lookups: Any
    ) -> CheckedCall:
        for observer in self.observers:
            observer(f"{service}:{operation}", params)
        requests = authorizations(service, operation, params, lookups)
        decisions = tuple(self._decide(principal, request) for request in requests)
        checked = CheckedCall(principal.name, principal.role_arn, f"{service}:{operation}", decisions)
        with self._lock:
            self.calls.append(checked)
        return checked

    def _decide(self, principal: Principal, authorization: Authorization) -> Decision:
        request = Request(
            authorization.action,
            authorization.resource,
            {**SECURE_TRANSPORT, **principal.context, **authorization.context},
        )
        resource_policy = self._resource_policies.get(authorization.resource)
        if resource_policy is None:
            return evaluate(principal.statements, request)
        applying = tuple(
            statement
            for statement, named in zip(resource_policy.statements, resource_policy.principals, strict=True)
            if _names(named, principal)
        )
        if authorization.action.startswith("kms:"):
            # A key policy is the root of a key's access: IAM policies count only where it delegates
            # to the account (KMS Developer Guide, key-policy-default.html, "allows access to the
            # AWS account and enables IAM policies").
            delegated = evaluate(
                [
                    s
                    for s, n in zip(resource_policy.statements, resource_policy.principals, strict=True)
                    if _is_root(n, self.iam.bindings.account)
                ],
                request,
            )
            if not delegated.allowed:
                return Decision(
                    False, request, near_misses=("the key policy does not delegate to IAM policies",)
                )
        combined = evaluate((*principal.statements, *applying), request)
        return combined

    def _evaluator(self, fixed: Principal | None, lookups: _Lookups) -> Callable[..., None]:
        def evaluate_call(params: Mapping[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
            if getattr(self._simulating, "active", False):
                return
            principal = fixed or _acting.get()
            if principal is None:
                with self._lock:
                    self.unchecked += 1
                return
            service = model.service_model.service_name
            checked = self.check(principal, service, model.name, params, lookups)
            if not checked.allowed and not context.get("replayed"):
                # A call replayed from another process has happened already: it is only noted.
                context[_STASH] = (service, model.name, checked)

        return evaluate_call

    def _simulated_create_fleet(
        self, create_fleet: Callable[..., Any], fixed: Principal | None, lookups: _Lookups
    ) -> Callable[..., Any]:
        def checked_create_fleet(**params: Any) -> Any:
            principal = fixed or _acting.get()
            if principal is None:
                with self._lock:
                    self.unchecked += 1
            else:
                checked = self.check(principal, "ec2", "CreateFleet", params, lookups)
                if not checked.allowed:
                    code, _ = _DENIED_CODES["ec2"]
                    raise ClientError({"Error": {"Code": code, "Message": _message(checked)}}, "CreateFleet")
            self._simulating.active = True
            try:
                return create_fleet(**params)
            finally:
                self._simulating.active = False

        return checked_create_fleet


def _answer_denied(context: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]] | None:
    """Answer a denied call as the service does, instead of sending it."""
    stashed = context.pop(_STASH, None)
    if stashed is None:
        return None
    service, _operation, checked = stashed
    answer = denied_answer(service, checked)
    http = AWSResponse(
        "https://iam-check.local/", answer["ResponseMetadata"]["HTTPStatusCode"], HTTPHeaders(), None
    )
    return http, answer


def denied_answer(service: str, checked: CheckedCall) -> dict[str, Any]:
    """What `service` answers a call the policy denied: its error code, HTTP status and AWS's message."""
    code, status = _DENIED_CODES.get(service, ("AccessDeniedException", 400))
    return {
        "Error": {"Code": code, "Message": _message(checked)},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }


def _message(checked: CheckedCall) -> str:
    """AWS's wording: "User: <arn> is not authorized to perform: <action> on resource: <arn> because no
    identity-based policy allows the <action> action" (IAM User Guide, troubleshoot_access-denied.html)."""
    first = next(d for d in checked.decisions if not d.allowed)
    return (
        f"User: {checked.principal} is not authorized to perform: {first.request.action} on resource: "
        f"{first.request.resource} because no identity-based policy allows the {first.request.action} action"
    )


def _lacking(request: Request) -> str:
    """The statement that would allow the request."""
    keys = {
        k: v for k, v in request.context.items() if not k.startswith(("aws:Principal", "aws:SecureTransport"))
    }
    return f"Allow {request.action} on {request.resource}" + (f" (request context: {keys})" if keys else "")


def _names(principal_element: Any, principal: Principal) -> bool:
    if principal_element is None:
        return False
    if principal_element == "*":
        return True
    wanted = principal_element.get("AWS", []) if isinstance(principal_element, Mapping) else []
    wanted = [wanted] if isinstance(wanted, str) else wanted
    # The account's root as Principal does not name the role: it delegates to the account's IAM policies
    # (IAM User Guide, reference_policies_elements_principal.html#principal-accounts).
    return any(w in ("*", principal.role_arn) for w in wanted)


def _is_root(principal_element: Any, account: str) -> bool:
    wanted = principal_element.get("AWS", []) if isinstance(principal_element, Mapping) else []
    wanted = [wanted] if isinstance(wanted, str) else wanted
    return any(w == account or (w.startswith("arn:") and w.endswith(f":iam::{account}:root")) for w in wanted)


_UNCHECKED_CLIENT: Callable[..., Any] = boto3.session.Session.client
"""boto3's own client maker, taken at import: emulator/iam_agent.py replaces `Session.client` in an agent's
process so that every client the agent makes is checked, and the lookups' own clients must not be."""


@cache
def _session() -> boto3.session.Session:
    return boto3.session.Session()


def _unchecked_client(service: str, **kwargs: Any) -> Any:
    return _UNCHECKED_CLIENT(_session(), service, **kwargs)


class _Lookups:
    """What the call table needs of the local world, read with clients of its own (not checked)."""

    def __init__(self, iam: StackIam, client: Any) -> None:
        self._iam = iam
        self.partition = iam.bindings.partition
        self.region = client.meta.region_name
        self.account = iam.bindings.account
        self._endpoint = client.meta.endpoint_url
        self._keys = iam.table_partition_keys()
        self._roles = iam.launch_template_roles()
        self._clients: dict[str, Any] = {}
        self._queue_tags: dict[str, Mapping[str, str]] = {}
        self._lock = threading.Lock()

    def _client(self, service: str) -> Any:
        with self._lock:
            if service not in self._clients:
                self._clients[service] = _unchecked_client(
                    service,
                    region_name=self.region,
                    endpoint_url=None if "amazonaws.com" in self._endpoint else self._endpoint,
                    aws_access_key_id="iam-check",
                    aws_secret_access_key="iam-check",  # noqa: S106
                )
            return self._clients[service]

    def partition_key(self, table_name: str) -> str:
        if table_name not in self._keys:
            schema = self._client("dynamodb").describe_table(TableName=table_name)["Table"]["KeySchema"]
            self._keys[table_name] = next(k["AttributeName"] for k in schema if k["KeyType"] == "HASH")
        return self._keys[table_name]

    def secret_arn(self, secret_id: str) -> str:
        if secret_id.startswith("arn:"):
            return secret_id
        return str(self._client("secretsmanager").describe_secret(SecretId=secret_id)["ARN"])

    def instance_tags(self, instance_id: str) -> Mapping[str, str]:
        """An instance EC2 does not show has no tags, so a tag-conditioned TerminateInstances is denied
        (runs-on/terraform-aws-runs-on#60; the fleet adapter sorts that out). Any other answer without
        tags is logged, so that a denial for want of the stack tag says whether the instance was gone
        or the lookup failed (two such denials under full-suite load left it open)."""
        try:
            reservations = self._client("ec2").describe_instances(InstanceIds=[instance_id])["Reservations"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "InvalidInstanceID.NotFound":
                _log.warning("DescribeInstances of %s for its tags failed: %r", instance_id, exc)
            return {}
        tags = {
            tag["Key"]: tag["Value"]
            for reservation in reservations
            for instance in reservation["Instances"]
            for tag in instance.get("Tags", [])
        }
        if not tags:
            _log.warning("DescribeInstances shows %s without tags: %r", instance_id, reservations)
        return tags

    def launch_inputs(self, template_id: str) -> LaunchInputs:
        versions = self._client("ec2").describe_launch_template_versions(
            LaunchTemplateId=template_id, Versions=["$Default"]
        )["LaunchTemplateVersions"]
        data = versions[0]["LaunchTemplateData"]
        return LaunchInputs(
            image_id=data.get("ImageId", ""),
            security_group_ids=tuple(data.get("SecurityGroupIds", [])),
            role_arn=self._roles.get(template_id),
        )

    def queue_tags(self, queue_url: str) -> Mapping[str, str] | None:
        """A queue's tags, None when it does not exist. Kept once seen: our queues get their tags when
        they are created and never after (a queue deleted since is then answered by SQS itself)."""
        name = queue_url.rstrip("/").rsplit("/", 1)[-1]
        with self._lock:
            if name in self._queue_tags:
                return self._queue_tags[name]
        client = self._client("sqs")
        try:
            url = client.get_queue_url(QueueName=name)["QueueUrl"]
            tags: Mapping[str, str] = client.list_queue_tags(QueueUrl=url).get("Tags", {})
        except ClientError:
            return None
        with self._lock:
            self._queue_tags[name] = tags
        return tags

    def key_arn(self, key_id: str) -> str:
        if key_id.startswith("arn:") and ":key/" in key_id:
            return key_id
        if key_id.startswith(("alias/", "arn:")):
            return str(self._client("kms").describe_key(KeyId=key_id)["KeyMetadata"]["Arn"])
        return f"arn:{self.partition}:kms:{self.region}:{self.account}:key/{key_id}"


# --- what a test run used of the grants -------------------------------------------------------------

USAGE_DIRECTORY_VARIABLE = "RUNNER_POOL_IAM_USAGE_DIR"
"""Where each check writes, when it ends, the grants its calls used (the test session sets it)."""
NOT_RECORDED = ("logs:", "xray:")
"""Granted for the Lambda runtime's logs and X-Ray's daemon, which make no botocore call we can record."""


def save_usage(check: PolicyCheck, directory: str | None = None) -> None:
    """Note the calls checked and the grants they used, for `usage_report`."""
    directory = directory or os.environ.get(USAGE_DIRECTORY_VARIABLE)
    if not directory:
        return
    with check._lock:
        calls = list(check.calls)
        unchecked = check.unchecked
    used = sorted(
        {
            (call.role, decision.allowed_by.describe(), decision.request.action)
            for call in calls
            for decision in call.decisions
            if decision.allowed_by is not None
        }
    )
    principals = [check.iam.function(handler) for handler in check.iam.handlers()]
    principals += [
        check.iam.role(role, name="instances") for role in set(check.iam.instance_roles().values())
    ]
    granted = sorted(
        {
            (principal.role_arn, statement.describe(), action)
            for principal in principals
            for statement in principal.statements
            if statement.effect == "Allow"
            for action in statement.actions
            if not action.startswith(NOT_RECORDED)
        }
    )
    record = {
        "test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0],
        "checked": len(calls),
        "unchecked": unchecked,
        "used": used,
        "granted": granted,
    }
    path = Path(directory) / f"{os.getpid()}-{uuid.uuid4().hex}.json"
    path.write_text(json.dumps(record))


def usage_report(directory: Path) -> list[str]:
    """Calls checked in all, per end-to-end test, and the grants no checked call used."""
    records = [json.loads(path.read_text()) for path in sorted(directory.glob("*.json"))]
    if not records:
        return []
    # By role and action: each local stack names its resources its own way.
    used = {(role, action) for record in records for role, _statement, action in record["used"]}
    granted = {(role, action) for record in records for role, _statement, action in record["granted"]}
    lines = [
        f"{sum(r['checked'] for r in records)} AWS calls checked against the synthesized IAM policies "
        f"in {len(records)} local stacks ({sum(r['unchecked'] for r in records)} setup calls not checked)"
    ]
    per_test: dict[str, int] = {}
    for record in records:
        if record["test"].startswith("tests/e2e/"):
            per_test[record["test"]] = per_test.get(record["test"], 0) + record["checked"]
    lines += [f"  {count:6d} calls in {test}" for test, count in sorted(per_test.items())]
    unused = sorted(granted - used)
    if unused:
        lines.append(
            f"{len(unused)} granted actions no checked call used (least privilege: remove, or test):"
        )
        lines += [f"  {role.rsplit('/', 1)[-1]}: {action}" for role, action in unused]
    return lines


# --- plugging into a harness -----------------------------------------------------------------------

_installed: PolicyCheck | None = None


def attach_policy_check(iam: StackIam) -> PolicyCheck:
    """A check of `iam` (the synthesized stack's policies, bound to a local stack: emulator/stack.py),
    installed for the agents until `detach_policy_check`."""
    global _installed  # noqa: PLW0603 - one local stack per process at a time, like use_control_plane
    _installed = PolicyCheck(iam)
    return _installed


def detach_policy_check(check: PolicyCheck) -> None:
    global _installed  # noqa: PLW0603
    save_usage(check)
    if _installed is check:
        _installed = None


def installed_check() -> PolicyCheck | None:
    return _installed


def as_world(function: Callable[..., Any]) -> Callable[..., Any]:
    """`function` run as the test's world, not as the function whose invocation calls it: e.g. a step's
    in-line pause, during which a test lets scripted agents act on the shared clients."""

    @wraps(function)
    def outside(*args: Any, **kwargs: Any) -> Any:
        token = _acting.set(None)
        try:
            return function(*args, **kwargs)
        finally:
            _acting.reset(token)

    return outside
