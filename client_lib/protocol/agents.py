"""Agents and policies on the wire: identifiers, their limits, and the policy mapping.

Shared by the daemon (which validates what arrives and routes each agent's episodes to
its policy) and client_lib (which must pick the same policy to act with). Pure: no I/O.

An *agent id* names one agent of a simulator connection (``"red_3"``, ``"car-17"``); each
agent id has its own episodes. A *policy* is a named network; ``DEFAULT_POLICY`` always
exists and is the one a single-agent client (no ``agent_id``) acts with. The *policy
mapping* is an ordered list of ``[pattern, policy]`` rules; an agent id takes the policy
of the first rule whose shell-style pattern (``fnmatch``: ``*``, ``?``, ``[seq]``,
case-sensitive) matches it, and ``DEFAULT_POLICY`` when none does.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase

DEFAULT_POLICY = "default"
MAX_AGENT_ID_CHARS = 64
"""Longest agent id (and episode id) accepted, in characters."""
MAX_POLICIES = 16
MAX_MAPPING_RULES = 256
POLICY_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_PRINTABLE = re.compile(r"[\x20-\x7e]+")


class MappingError(ValueError):
    """A policy mapping or a policy name is malformed (config or SET_CONFIG)."""


def id_error(value: object, what: str) -> str | None:
    """Why ``value`` is not a usable agent or episode id (None when it is): a string of
    1..MAX_AGENT_ID_CHARS printable ASCII characters."""
    if not isinstance(value, str):
        return f"{what} must be a string"
    if not 1 <= len(value) <= MAX_AGENT_ID_CHARS:
        return f"{what} must have 1..{MAX_AGENT_ID_CHARS} characters, got {len(value)}"
    if not _PRINTABLE.fullmatch(value):
        return f"{what} must be printable ASCII"
    return None


def check_policy_name(name: object, what: str) -> str:
    """``name`` if it is a valid policy name, else MappingError."""
    if not isinstance(name, str) or not POLICY_NAME.fullmatch(name):
        raise MappingError(f"{what}: policy names are 1..64 of [A-Za-z0-9_-], got {name!r}")
    return name


@dataclass(frozen=True)
class PolicyMapping:
    """Ordered ``(pattern, policy)`` rules; first match wins, else ``DEFAULT_POLICY``."""

    rules: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if len(self.rules) > MAX_MAPPING_RULES:
            raise MappingError(f"policy_mapping: at most {MAX_MAPPING_RULES} rules")
        for pattern, policy in self.rules:
            if not isinstance(pattern, str) or not 1 <= len(pattern) <= 256:
                raise MappingError(f"policy_mapping: pattern {pattern!r} must be a string of "
                                   "1..256 characters")
            check_policy_name(policy, f"policy_mapping[{pattern!r}]")

    def policy_for(self, agent_id: str | None) -> str:
        """The policy an agent acts with (None, a single-agent client: the default)."""
        if agent_id is None:
            return DEFAULT_POLICY
        for pattern, policy in self.rules:
            if fnmatchcase(agent_id, pattern):
                return policy
        return DEFAULT_POLICY

    def policies(self) -> set[str]:
        """Every policy a rule names."""
        return {policy for _, policy in self.rules}

    def to_json(self) -> list[list[str]]:
        return [[pattern, policy] for pattern, policy in self.rules]

    @classmethod
    def from_json(cls, value: object) -> PolicyMapping:
        """From ``[[pattern, policy], ...]`` (SET_CONFIG) or ``{pattern: policy}`` (TOML,
        in file order). MappingError when malformed."""
        if isinstance(value, dict):
            pairs = list(value.items())
        elif isinstance(value, list) and all(isinstance(r, list) and len(r) == 2 for r in value):
            pairs = [(r[0], r[1]) for r in value]
        else:
            raise MappingError("policy_mapping: expected {pattern = policy, ...} or "
                               "[[pattern, policy], ...]")
        return cls(tuple(pairs))
