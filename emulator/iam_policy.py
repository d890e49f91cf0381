"""IAM's decision for one request against a principal's identity-policy statements, as AWS documents it.

Only what our stack's policies use is modelled; anything else (an operator we do not know) raises
instead of guessing. The rules, each from the IAM User Guide:

- evaluation logic (reference_policies_evaluation-logic.html): an explicit Deny in any statement wins;
  otherwise one Allow that applies allows; otherwise the request is implicitly denied.
- Action / NotAction (reference_policies_elements_action.html, _notaction.html): `service:Name`,
  case-insensitive, with `*` and `?` wildcards; NotAction applies to every action it does not list.
- Resource / NotResource (reference_policies_elements_resource.html, _notresource.html): ARNs
  compared segment by segment (partition, service, region, account, resource), case-sensitive, `*`
  and `?` within a segment; `*` alone is every resource. Policy variables may appear in them.
- Condition (reference_policies_elements_condition.html, _condition_operators.html): operators are
  ANDed, keys within an operator are ANDed, the values of one key are ORed (NORed for a negated
  operator). Key names are case-insensitive. A key absent from the request context fails every
  operator but the negated ones (true) and `...IfExists` (true) and `Null`.
- Multivalued keys (reference_policies_condition-single-vs-multi-valued-context-keys.html):
  `ForAllValues:` holds when every request value matches some policy value, and also when the key is
  absent or empty; `ForAnyValue:` holds when at least one does, never when the key is absent.
- Policy variables (reference_policies_variables.html): `${key}` in a Resource or a condition value is
  replaced by the request's value of `key`; `${*}`, `${?}`, `${$}` are the literal characters. A
  variable AWS cannot resolve (key absent) makes the statement match nothing.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ContextValue = str | tuple[str, ...]
"""A single-valued key's value, or a multivalued key's values."""

_VARIABLE = re.compile(r"\$\{([^}]*)\}")
_LITERAL_VARIABLES = {"*": "*", "?": "?", "$": "$"}


class UnresolvedVariableError(LookupError):
    """A policy variable whose key the request does not carry: the statement cannot apply."""


@dataclass(frozen=True)
class Request:
    """What IAM authorizes: one action on one resource, with the request context its conditions read."""

    action: str
    resource: str
    context: Mapping[str, ContextValue] = field(default_factory=dict)

    def value(self, key: str) -> ContextValue | None:
        """Context key names are case-insensitive (reference_policies_elements_condition.html)."""
        wanted = key.lower()
        for name, value in self.context.items():
            if name.lower() == wanted:
                return value
        return None


@dataclass(frozen=True)
class Statement:
    """One statement of an identity policy, with the name of the policy it came from (for messages)."""

    effect: str
    actions: tuple[str, ...] = ()
    not_actions: tuple[str, ...] = ()
    resources: tuple[str, ...] = ()
    not_resources: tuple[str, ...] = ()
    conditions: Mapping[str, Mapping[str, tuple[str, ...]]] = field(default_factory=dict)
    sid: str | None = None
    policy: str = ""

    @classmethod
    def from_json(cls, statement: Mapping[str, Any], policy: str = "") -> Statement:
        """A statement as IAM's JSON grammar writes it (strings or lists; values of conditions too)."""
        return cls(
            effect=statement["Effect"],
            actions=_strings(statement.get("Action")),
            not_actions=_strings(statement.get("NotAction")),
            resources=_strings(statement.get("Resource")),
            not_resources=_strings(statement.get("NotResource")),
            conditions={
                operator: {key: _strings(values) for key, values in keys.items()}
                for operator, keys in statement.get("Condition", {}).items()
            },
            sid=statement.get("Sid"),
            policy=policy,
        )

    def describe(self) -> str:
        parts = [f"{self.effect} {'|'.join(self.actions or ('NOT ' + '|'.join(self.not_actions),))}"]
        parts.append(f"on {' '.join(self.resources or ('NOT ' + ' '.join(self.not_resources),))}")
        if self.conditions:
            parts.append(f"if {dict(self.conditions)}")
        name = f"{self.policy}/{self.sid}" if self.sid else self.policy
        return f"[{name}] " + " ".join(parts) if name else " ".join(parts)

    def matches_action(self, action: str) -> bool:
        if self.actions:
            return any(_glob(pattern.lower(), action.lower()) for pattern in self.actions)
        return not any(_glob(pattern.lower(), action.lower()) for pattern in self.not_actions)

    def matches_resource(self, request: Request) -> bool:
        patterns = self.resources or self.not_resources
        try:
            found = any(_arn_matches(_substitute(p, request), request.resource) for p in patterns)
        except UnresolvedVariableError:
            return False
        return found if self.resources else not found

    def unmet_conditions(self, request: Request) -> list[str]:
        """The condition entries this request fails (empty: every condition holds)."""
        unmet = []
        for operator, keys in self.conditions.items():
            for key, values in keys.items():
                if not condition_holds(operator, key, values, request):
                    unmet.append(f"{operator} {key} {list(values)} (request has {request.value(key)!r})")
        return unmet


@dataclass(frozen=True)
class Decision:
    allowed: bool
    request: Request
    allowed_by: Statement | None = None
    denied_by: Statement | None = None
    near_misses: tuple[str, ...] = ()
    """For an implicit deny: statements that name the action and resource but whose conditions fail."""

    def explain(self) -> str:
        if self.allowed:
            return f"allowed by {self.allowed_by.describe() if self.allowed_by else '?'}"
        if self.denied_by is not None:
            return f"explicitly denied by {self.denied_by.describe()}"
        lacking = f"no statement allows {self.request.action} on {self.request.resource}"
        if self.near_misses:
            lacking += "; statements for it whose conditions fail: " + "; ".join(self.near_misses)
        return lacking


def evaluate(statements: Iterable[Statement], request: Request) -> Decision:
    """IAM's decision within one account for an identity policy (no resource policy, boundary or SCP)."""
    allowing: Statement | None = None
    near: list[str] = []
    for statement in statements:
        if not (statement.matches_action(request.action) and statement.matches_resource(request)):
            continue
        unmet = statement.unmet_conditions(request)
        if unmet:
            if statement.effect == "Allow":
                near.append(f"{statement.describe()} fails {'; '.join(unmet)}")
            continue
        if statement.effect == "Deny":
            return Decision(False, request, denied_by=statement)
        allowing = allowing or statement
    if allowing is not None:
        return Decision(True, request, allowed_by=allowing)
    return Decision(False, request, near_misses=tuple(near))


# --- conditions ----------------------------------------------------------------------------------


def condition_holds(  # noqa: PLR0911 - one return per documented case
    operator: str, key: str, policy_values: Sequence[str], request: Request
) -> bool:
    """One `operator: {key: values}` entry of a Condition block against the request."""
    qualifier, _, base = operator.rpartition(":")
    if_exists = base.endswith("IfExists")
    base = base.removesuffix("IfExists")
    present = request.value(key)
    if base == "Null":
        wants_absent = [value.lower() == "true" for value in policy_values]
        absent = present is None or present == ()
        return any(want == absent for want in wants_absent)
    try:
        resolved = [_substitute(value, request) for value in policy_values]
    except UnresolvedVariableError:
        return False
    compare, negated = _operator(base)
    if qualifier:
        values = () if present is None else (present if isinstance(present, tuple) else (present,))
        if qualifier == "ForAllValues":
            # Every request value must match; an absent or empty key holds (the documented pitfall).
            return all(_matches(compare, negated, value, resolved) for value in values)
        if qualifier == "ForAnyValue":
            return any(_matches(compare, negated, value, resolved) for value in values)
        raise ValueError(f"unknown set operator {qualifier!r} in {operator!r}")
    if present is None:
        return if_exists or negated
    if isinstance(present, tuple):
        # A single-valued operator on a multivalued key: true if any value matches, as AWS compares
        # each value of the key (reference_policies_condition-single-vs-multi-valued-context-keys.html).
        return any(_matches(compare, negated, value, resolved) for value in present)
    return _matches(compare, negated, present, resolved)


def _matches(compare: Any, negated: bool, value: str, policy_values: Sequence[str]) -> bool:
    hit = any(compare(value, policy_value) for policy_value in policy_values)
    return not hit if negated else hit


def _operator(name: str) -> tuple[Any, bool]:
    """The comparison of an operator (without qualifier or IfExists), and whether it is negated."""
    comparisons = {
        "StringEquals": lambda value, pattern: value == pattern,
        "StringEqualsIgnoreCase": lambda value, pattern: value.lower() == pattern.lower(),
        "StringLike": lambda value, pattern: _glob(pattern, value),
        "ArnEquals": _arn_matches_reversed,
        "ArnLike": _arn_matches_reversed,
        "Bool": lambda value, pattern: value.lower() == pattern.lower(),
    }
    negations = {
        "StringNotEquals": "StringEquals",
        "StringNotEqualsIgnoreCase": "StringEqualsIgnoreCase",
        "StringNotLike": "StringLike",
        "ArnNotEquals": "ArnEquals",
        "ArnNotLike": "ArnLike",
    }
    if name in comparisons:
        return comparisons[name], False
    if name in negations:
        return comparisons[negations[name]], True
    raise ValueError(f"condition operator {name!r} is not modelled; add it with its documented rule")


def _arn_matches_reversed(value: str, pattern: str) -> bool:
    return _arn_matches(pattern, value)


# --- matching ------------------------------------------------------------------------------------


def _glob(pattern: str, value: str) -> bool:
    """IAM's wildcards: `*` any run of characters, `?` one character; nothing else is special."""
    wildcard = _wildcard(pattern)
    return value == pattern if wildcard is None else wildcard.fullmatch(value) is not None


@functools.lru_cache(maxsize=4096)
def _wildcard(pattern: str) -> re.Pattern[str] | None:
    """`pattern` compiled, once for every call checked against it; None when it holds no wildcard (a
    policy's patterns are few, and every call of a test is checked against each of them)."""
    if "*" not in pattern and "?" not in pattern:
        return None
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(regex, flags=re.DOTALL)


def _arn_matches(pattern: str, arn: str) -> bool:
    """`*` alone matches anything; otherwise the first five segments match one by one and the resource
    segment (which may itself hold colons) as a whole (reference_policies_elements_resource.html)."""
    if pattern == "*":
        return True
    wanted = pattern.split(":", 5)
    given = arn.split(":", 5)
    if len(wanted) != 6 or len(given) != 6:
        return _glob(pattern, arn)
    return all(_glob(w, g) for w, g in zip(wanted, given, strict=True))


def _substitute(text: str, request: Request) -> str:
    def replace(variable: re.Match[str]) -> str:
        name = variable.group(1)
        if name in _LITERAL_VARIABLES:
            return _LITERAL_VARIABLES[name]
        key, _, default = name.partition(",")
        value = request.value(key.strip())
        if value is None or isinstance(value, tuple):
            default = default.strip().strip("'")
            if default:
                return default
            raise UnresolvedVariableError(key.strip())
        return value

    return _VARIABLE.sub(replace, text)


def _strings(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(str(v) for v in value)


def glob_matches(pattern: str, value: str) -> bool:
    """IAM's wildcard match, for callers that compare actions or resources themselves."""
    return _glob(pattern, value) if ":" not in pattern else _arn_matches(pattern, value)
