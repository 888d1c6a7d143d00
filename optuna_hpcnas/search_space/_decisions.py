"""The decisions of a hierarchical search space: their levels and their choices."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

Choice = str | int


class Level(str, Enum):
    """The level of the hierarchy a decision belongs to."""

    TOPOLOGY = "topology"
    OPERATOR = "operator"
    MICRO = "micro"
    CLUSTER = "cluster"


@dataclass(frozen=True)
class Decision:
    """One categorical decision of the space.

    ``parent``/``active_when`` make it conditional: it exists only while the parent decision
    takes one of the ``active_when`` values.
    """

    name: str
    level: Level
    choices: tuple[Choice, ...]
    parent: str | None = None
    active_when: frozenset[Choice] | None = None

    @property
    def is_constant(self) -> bool:
        """A decision with a single choice is not suggested: its value is fixed."""
        return len(self.choices) == 1
