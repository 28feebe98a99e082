"""What both deterministic simulations (``sim``: workflows, ``outbox_sim``: the outbox) share:
the fault spec of a seed's command line, and silencing the logs of the faults they inject."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar, TypeVar

__all__ = ["FaultSpec", "quiet"]

F = TypeVar("F", bound="FaultSpec")


class FaultSpec:
    """Mixin of a frozen dataclass of fault rates (one float field per kind in ``KINDS``)."""

    KINDS: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def parse(cls: type[F], spec: str) -> F:
        """``all``, ``none`` or a comma list of kinds (the others off)."""
        if spec == "all":
            return cls()
        kinds = [] if spec in ("", "none") else spec.split(",")
        unknown = [k for k in kinds if k not in cls.KINDS]
        if unknown:
            raise ValueError(f"unknown fault kinds {unknown}; known: {', '.join(cls.KINDS)}")
        rates: dict[str, Any] = {k: (getattr(cls(), k) if k in kinds else 0.0) for k in cls.KINDS}
        return cls(**rates)

    def spec(self) -> str:
        on = [k for k in self.KINDS if getattr(self, k) > 0]
        return "all" if on == list(self.KINDS) and self == type(self)() else (",".join(on) or "none")


@contextmanager
def quiet() -> Iterator[None]:
    """The library logs every injected fault: silence it while simulating."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(previous)
