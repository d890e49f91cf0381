"""The synthesized stack's IAM, resolved against the local resources: each principal's statements.

`StackIam` reads from the synthesized template (emulator/template.py), for each Lambda function (by
its handler) and for the instance role, the statements of every AWS::IAM::Policy attached to its
role, with Ref, Fn::GetAtt, Fn::Join and Fn::Sub resolved against the local stack's names: each
function's environment in the template (`RUNNER_POOL_TABLE_NAME: {Ref: StateTable…}`) is matched with
the value the local stack gives that variable, which binds the logical id to the local name; ARNs
follow from the resource type as CloudFormation documents each type's `Ref` and `Fn::GetAtt Arn`
return values. Resources no environment names (the roles, log
groups) resolve to names made of their logical ids, the same on both sides of every comparison.

Resource policies: the queues' policies (Deny without TLS) and the credentials key's policy are read
too. The key policy must delegate to the account (KMS Developer Guide, key-policy-default.html: the
account root principal lets IAM policies grant the key's use), else no IAM policy can allow a KMS call.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from emulator.iam_policy import ContextValue, Statement
from emulator.template import synthesized_template

_SUB = re.compile(r"\$\{([^}!]+)\}")
_MARK = "@@hole-{}@@"
_MARKED = re.compile(r"@@hole-(\d+)@@")


# --- binding the template to the local stack -------------------------------------------------------


class BindingError(ValueError):
    pass


@dataclass
class Bindings:
    """What each logical id's Ref and attributes are on the local stack, and literal renamings."""

    partition: str
    region: str
    account: str
    resources: Mapping[str, Any]
    values: dict[tuple[str, str], str] = field(default_factory=dict)
    literals: dict[str, str] = field(default_factory=dict)
    """A literal of the template (e.g. the stack's name in a tag condition) → its local value."""
    revision: int = 0
    """How many bindings were written: a resolution made at one revision holds until the next."""

    def bind_environment(self, template_environment: Mapping[str, Any], local: Mapping[str, str]) -> None:
        """Match a function's environment in the template with what the local stack gives it."""
        for name, expression in template_environment.items():
            if name in local:
                self._unify(expression, local[name])

    def _unify(self, expression: Any, value: str) -> None:
        if isinstance(expression, str):
            if expression != value and not _is_json(expression) and self.literals.get(expression) != value:
                self.literals[expression] = value
                self.revision += 1
            return
        if "Ref" in expression:
            self._bind((expression["Ref"], "Ref"), value)
        elif "Fn::GetAtt" in expression:
            logical, attribute = expression["Fn::GetAtt"]
            self._bind((logical, attribute), value)
        elif "Fn::Join" in expression:
            self._unify_join(expression["Fn::Join"], value)

    def _unify_join(self, join: list[Any], value: str) -> None:
        separator, parts = join
        holes: list[Any] = []
        pieces = []
        for part in parts:
            if isinstance(part, str):
                pieces.append(part)
            else:
                pieces.append(_MARK.format(len(holes)))
                holes.append(part)
        text = separator.join(pieces)
        if _is_json(text) and _is_json(value):
            self._unify_json(json.loads(text), json.loads(value), holes)
            return
        self._unify_marked(text, value, holes)

    def _unify_json(self, shape: Any, value: Any, holes: list[Any]) -> None:
        if isinstance(shape, dict) and isinstance(value, dict):
            for key in shape.keys() & value.keys():
                self._unify_json(shape[key], value[key], holes)
        elif isinstance(shape, list) and isinstance(value, list):
            for one, other in zip(shape, value, strict=False):
                self._unify_json(one, other, holes)
        elif isinstance(shape, str) and isinstance(value, str):
            self._unify_marked(shape, value, holes)

    def _unify_marked(self, text: str, value: str, holes: list[Any]) -> None:
        pieces = _MARKED.split(text)
        pattern = "".join(re.escape(p) if n % 2 == 0 else "(.*?)" for n, p in enumerate(pieces))
        found = re.fullmatch(pattern, value, flags=re.DOTALL)
        if found is None:
            raise BindingError(f"the local value {value!r} does not have the template's shape {text!r}")
        for hole, captured in zip(pieces[1::2], found.groups(), strict=True):
            self._unify(holes[int(hole)], captured)

    def _bind(self, key: tuple[str, str], value: str) -> None:
        if key[0].startswith("AWS::"):
            if self.pseudo(key[0]) not in (None, value):
                raise BindingError(f"{key[0]} is {self.pseudo(key[0])!r} locally, not {value!r}")
            return
        if self.values.get(key, value) != value:
            raise BindingError(f"{key} is bound to both {self.values[key]!r} and {value!r}")
        if key not in self.values:
            self.values[key] = value
            self.revision += 1

    def pseudo(self, name: str) -> str | None:
        return {
            "AWS::Partition": self.partition,
            "AWS::Region": self.region,
            "AWS::AccountId": self.account,
            "AWS::URLSuffix": "amazonaws.com",
        }.get(name)

    # --- resolving

    def resolve(self, expression: Any) -> Any:  # noqa: PLR0911 - one return per intrinsic function
        """A template value with its intrinsic functions resolved against the local stack."""
        if isinstance(expression, str):
            return self.literals.get(expression, expression)
        if isinstance(expression, list):
            return [self.resolve(item) for item in expression]
        if not isinstance(expression, dict):
            return expression
        if "Ref" in expression:
            return self.ref(expression["Ref"])
        if "Fn::GetAtt" in expression:
            logical, attribute = expression["Fn::GetAtt"]
            return self.attribute(logical, attribute)
        if "Fn::Join" in expression:
            separator, parts = expression["Fn::Join"]
            return separator.join(str(self.resolve(part)) for part in parts)
        if "Fn::Sub" in expression:
            text = expression["Fn::Sub"]
            return _SUB.sub(lambda m: self._sub(m.group(1)), text if isinstance(text, str) else text[0])
        return {key: self.resolve(value) for key, value in expression.items()}

    def _sub(self, name: str) -> str:
        logical, _, attribute = name.partition(".")
        return self.attribute(logical, attribute) if attribute else self.ref(logical)

    def ref(self, logical: str) -> str:
        pseudo = self.pseudo(logical)
        if pseudo is not None:
            return pseudo
        if logical == "AWS::StackName":
            return self.values.get(("AWS::StackName", "Ref"), "RunnerPool")
        return self.values.get((logical, "Ref"), logical)

    def attribute(self, logical: str, attribute: str) -> str:
        if (logical, attribute) in self.values:
            return self.values[(logical, attribute)]
        kind = self.resources.get(logical, {}).get("Type", "")
        ref = self.ref(logical)
        if kind == "AWS::SQS::Queue" and "QueueName" in self.resources[logical]["Properties"]:
            # A named queue (the pool's): its URL ends with its name, though no function is told the URL.
            ref = self.resolve(self.resources[logical]["Properties"]["QueueName"])
        p, r, a = self.partition, self.region, self.account
        # The return values of each resource type (CloudFormation User Guide, the type's page).
        arns = {
            "AWS::DynamoDB::Table": f"arn:{p}:dynamodb:{r}:{a}:table/{ref}",
            "AWS::SQS::Queue": f"arn:{p}:sqs:{r}:{a}:{ref.rstrip('/').rsplit('/', 1)[-1]}",
            "AWS::KMS::Key": f"arn:{p}:kms:{r}:{a}:key/{ref}",
            "AWS::IAM::Role": f"arn:{p}:iam::{a}:role/{ref}",
            "AWS::IAM::InstanceProfile": f"arn:{p}:iam::{a}:instance-profile/{ref}",
            "AWS::Logs::LogGroup": f"arn:{p}:logs:{r}:{a}:log-group:{ref}:*",
            "AWS::Lambda::Function": f"arn:{p}:lambda:{r}:{a}:function:{ref}",
            "AWS::StepFunctions::StateMachine": ref,
        }
        if attribute == "Arn" and kind in arns:
            return arns[kind]
        return f"{logical}.{attribute}"


def _is_json(text: str) -> bool:
    if text[:1] not in ("{", "["):
        return False
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


# --- principals --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Principal:
    """Who makes a call: a role's resolved statements, and the request context its credentials bring."""

    name: str
    role_arn: str
    statements: tuple[Statement, ...]
    context: Mapping[str, ContextValue] = field(default_factory=dict)


@dataclass(frozen=True)
class ResourcePolicy:
    resource_arn: str
    statements: tuple[Statement, ...]
    principals: tuple[Any, ...]
    """Each statement's Principal element, resolved (same order as `statements`)."""


class StackIam:
    """The roles and resource policies of the synthesized stack, bound to the local stack."""

    def __init__(self, template: Mapping[str, Any], bindings: Bindings) -> None:
        self.template = template
        self.resources: Mapping[str, Any] = template["Resources"]
        self.bindings = bindings
        self._statements: dict[tuple[str, int], tuple[Statement, ...]] = {}
        """Each role's statements as resolved at a revision of the bindings: every AWS call an instance's
        agent makes asks for its role's, and the local stack binds what it is given later too (`give`)."""

    @classmethod
    def bound(
        cls,
        template: Mapping[str, Any],
        local_environment: Mapping[str, str],
        *,
        partition: str = "aws",
        region: str,
        account: str,
    ) -> StackIam:
        """Bound through every function's environment: `local_environment` is what the local stack
        gives the functions (variable → value)."""
        bindings = Bindings(partition, region, account, template["Resources"])
        for function in _of_type(template["Resources"], "AWS::Lambda::Function"):
            variables = function["Properties"].get("Environment", {}).get("Variables", {})
            bindings.bind_environment(variables, local_environment)
        return cls(template, bindings)

    def handlers(self) -> dict[str, str]:
        """Each function's handler (`runner_pool.handlers.release.plan`) → its logical id."""
        return {
            resource["Properties"]["Handler"]: logical
            for logical, resource in self.resources.items()
            if resource["Type"] == "AWS::Lambda::Function"
        }

    def function(self, handler: str) -> Principal:
        """The principal of the function whose handler is `handler`."""
        logical = self.handlers().get(handler)
        if logical is None:
            raise LookupError(f"the synthesized template has no function with handler {handler!r}")
        role = self.resources[logical]["Properties"]["Role"]["Fn::GetAtt"][0]
        return self.role(role, name=handler)

    def of_role(self, role: str, instance_id: str | None = None) -> Principal:
        """The principal of a role by its logical id: an instance's agent when `instance_id` is given."""
        if instance_id is not None:
            return self._as_instance(role, instance_id)
        names = {
            resource["Properties"]["Role"]["Fn::GetAtt"][0]: handler
            for handler, logical in self.handlers().items()
            for resource in [self.resources[logical]]
        }
        return self.role(role, name=names.get(role, role))

    def instance_roles(self) -> dict[str, str]:
        """Each launch template's logical id → the logical id of the role its instance profile carries (the
        stack has another profile, the runner image builds', which no launch template names)."""
        roles = {}
        for logical, template in self.resources.items():
            if template["Type"] != "AWS::EC2::LaunchTemplate":
                continue
            profile = template["Properties"]["LaunchTemplateData"].get("IamInstanceProfile", {}).get("Arn")
            if profile is None:
                continue
            (role,) = self.resources[profile["Fn::GetAtt"][0]]["Properties"]["Roles"]
            roles[logical] = str(role["Ref"])
        return roles

    def instance_role(self, launch_template: str | None = None) -> str:
        """The logical id of the role an instance launched from `launch_template` (its local id) runs as, as
        EC2 gives an instance its launch template's profile; without a template (an instance a test ran by
        hand), the stack's one instance role, when it has only one."""
        roles = self.instance_roles()
        if launch_template is not None:
            bound = {self.bindings.ref(logical): role for logical, role in roles.items()}
            if launch_template not in bound:
                raise LookupError(
                    f"{launch_template} is none of the stack's launch templates: {sorted(bound)}"
                )
            return bound[launch_template]
        (role,) = set(roles.values())
        return role

    def instance(self, instance_id: str, launch_template: str | None = None) -> Principal:
        """An instance's agent: its launch template's role, with the context keys EC2 adds to requests signed
        with its credentials: ec2:SourceInstanceARN (SAR list_amazonec2.html, and the IAM User Guide's
        "AWS global condition context keys": the ARN of the instance the request came from)."""
        return self._as_instance(self.instance_role(launch_template), instance_id)

    def _as_instance(self, role_logical: str, instance_id: str) -> Principal:
        b = self.bindings
        arn = f"arn:{b.partition}:ec2:{b.region}:{b.account}:instance/{instance_id}"
        role = self.role(role_logical, name=f"instance {instance_id}")
        return Principal(
            role.name, role.role_arn, role.statements, {**role.context, "ec2:SourceInstanceARN": arn}
        )

    def role(self, logical: str, *, name: str) -> Principal:
        role_arn = self.bindings.attribute(logical, "Arn")
        key = (logical, self.bindings.revision)
        statements = self._statements.get(key)
        if statements is None:
            statements = self._statements[key] = tuple(
                Statement.from_json(self.bindings.resolve(statement), policy=policy_logical)
                for policy_logical, policy in self.resources.items()
                if policy["Type"] == "AWS::IAM::Policy" and {"Ref": logical} in policy["Properties"]["Roles"]
                for statement in policy["Properties"]["PolicyDocument"]["Statement"]
            )
        context = {"aws:PrincipalArn": role_arn, "aws:PrincipalAccount": self.bindings.account}
        return Principal(name, role_arn, statements, context)

    def resource_policies(self) -> dict[str, ResourcePolicy]:
        """Each queue's and key's resource policy, by the resource's local ARN."""
        found: dict[str, ResourcePolicy] = {}
        for logical, resource in self.resources.items():
            properties = resource["Properties"]
            if resource["Type"] == "AWS::SQS::QueuePolicy":
                documents = [
                    (self.bindings.attribute(q["Ref"], "Arn"), properties["PolicyDocument"])
                    for q in properties["Queues"]
                ]
            elif resource["Type"] == "AWS::KMS::Key":
                documents = [(self.bindings.attribute(logical, "Arn"), properties["KeyPolicy"])]
            else:
                continue
            for arn, document in documents:
                raw = document["Statement"]
                found[arn] = ResourcePolicy(
                    arn,
                    tuple(Statement.from_json(self.bindings.resolve(s), policy=logical) for s in raw),
                    tuple(self.bindings.resolve(s.get("Principal")) for s in raw),
                )
        return found

    def table_partition_keys(self) -> dict[str, str]:
        """Each table's local name → its partition key attribute, from the template's KeySchema."""
        return {
            self.bindings.ref(logical): next(
                k["AttributeName"] for k in resource["Properties"]["KeySchema"] if k["KeyType"] == "HASH"
            )
            for logical, resource in self.resources.items()
            if resource["Type"] == "AWS::DynamoDB::Table"
        }

    def launch_template_roles(self) -> dict[str, str]:
        """Each launch template's local id → the ARN of the role its instance profile passes."""
        return {
            self.bindings.ref(logical): self.bindings.attribute(role, "Arn")
            for logical, role in self.instance_roles().items()
        }

    def function_statements(self) -> dict[str, tuple[Statement, ...]]:
        """Every function's statements by handler, for least-privilege checks."""
        return {handler: self.function(handler).statements for handler in self.handlers()}


def _of_type(resources: Mapping[str, Any], kind: str) -> Iterable[Mapping[str, Any]]:
    return [resource for resource in resources.values() if resource["Type"] == kind]


WITHOUT_GRANT_VARIABLE = "RUNNER_POOL_IAM_WITHOUT_GRANT"
"""`<handler>=<action>` (e.g. `runner_pool.handlers.release.plan=dynamodb:Query`): the checked template
lacks that grant of that function's role. The negative control runs a named test with it set."""


def checked_template(overrides: str = "") -> dict[str, Any]:
    """The template the checks use: the synthesized one (with the config's `overrides`,
    synthesized_template), less the grant WITHOUT_GRANT_VARIABLE names."""
    template = synthesized_template(overrides)
    removed = os.environ.get(WITHOUT_GRANT_VARIABLE)
    if not removed:
        return template
    handler, _, action = removed.partition("=")
    return without_grant(template, handler, action)


def without_grant(template: Mapping[str, Any], handler: str, action: str) -> dict[str, Any]:
    """A copy of `template` in which the role of `handler`'s function no longer grants `action`."""
    copied: dict[str, Any] = json.loads(json.dumps(template))
    resources = copied["Resources"]
    (function,) = [
        r
        for r in resources.values()
        if r["Type"] == "AWS::Lambda::Function" and r["Properties"]["Handler"] == handler
    ]
    role = function["Properties"]["Role"]["Fn::GetAtt"][0]
    found = False
    for policy in resources.values():
        if policy["Type"] != "AWS::IAM::Policy" or {"Ref": role} not in policy["Properties"]["Roles"]:
            continue
        kept = []
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            actions = [statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"]
            found = found or action in actions
            remaining = [a for a in actions if a != action]
            if remaining:
                kept.append({**statement, "Action": remaining})
        policy["Properties"]["PolicyDocument"]["Statement"] = kept
    if not found:
        raise LookupError(f"{handler}'s role grants no {action}")
    return copied
