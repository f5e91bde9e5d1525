"""How long a controller waits on its worker groups: one ``CallLimit`` per kind of call.

A ``CallLimit`` is a timeout plus what a ``WorkerTimeoutError`` should say when it runs out:
the phase of the run the call belongs to and the config key that sets it. ``GroupTimeouts``
gives a worker group one limit for start-up, one per method name (the driver maps each role
method to its phase, e.g. ``generate_sequences`` -> ``generate``) and a default for the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional


@dataclass(frozen=True)
class CallLimit:
    """Wait at most ``timeout_s`` seconds (None: no limit) on a call of ``phase``, set by ``config_key``."""

    timeout_s: Optional[float]
    phase: Optional[str] = None
    config_key: Optional[str] = None


@dataclass(frozen=True)
class GroupTimeouts:
    """A worker group's limits: ``init`` for start-up, ``methods`` by method name, ``default`` for any other call."""

    init: CallLimit = CallLimit(600.0, "init")
    methods: Mapping[str, CallLimit] = field(default_factory=dict)
    default: CallLimit = CallLimit(None)

    def for_method(self, method: str) -> CallLimit:
        """The limit of a call to ``method`` (a role's method name, without the role)."""
        return self.methods.get(method, self.default)
