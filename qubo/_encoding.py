"""One-hot encoding of categorical decisions as binary variables.

Shared by the search space (``HierarchicalSearchSpace.encode``), the evolutionary sampler and
the QUBO solver: every decision becomes one group of bits of which exactly one is set.
Pure numpy, so it imports without dimod.
"""

from __future__ import annotations

from collections.abc import Hashable
from collections.abc import Sequence

import numpy as np


class OneHotEncoding:
    """A fixed order of one-hot groups.

    Args:
        names: One name per group.
        groups: The values of each group, in bit order.

    Examples:
        >>> enc = OneHotEncoding(["op", "k"], [["conv", "pool"], [3, 5, 7]])
        >>> enc.encode(["pool", 5]).tolist()
        [0, 1, 0, 1, 0]
        >>> enc.decode([0, 1, 0, 1, 0])
        ['pool', 5]
    """

    def __init__(self, names: Sequence[str], groups: Sequence[Sequence[Hashable]]) -> None:
        if len(names) != len(groups):
            raise ValueError(f"{len(names)} names were given for {len(groups)} groups.")
        if len(set(names)) != len(names):
            raise ValueError(f"Group names must be unique, but got {list(names)}.")
        self._names = tuple(names)
        self._groups = tuple(tuple(g) for g in groups)
        offsets = [0]
        for name, group in zip(self._names, self._groups):
            if len(group) == 0:
                raise ValueError(f"Group {name!r} has no values.")
            if len(set(group)) != len(group):
                raise ValueError(f"Group {name!r} has duplicate values: {list(group)}.")
            offsets.append(offsets[-1] + len(group))
        self._offsets = tuple(offsets)
        self._index = [{v: i for i, v in enumerate(g)} for g in self._groups]

    @property
    def names(self) -> tuple[str, ...]:
        return self._names

    @property
    def groups(self) -> tuple[tuple[Hashable, ...], ...]:
        return self._groups

    @property
    def n_bits(self) -> int:
        return self._offsets[-1]

    def slice(self, group: int) -> slice:
        """The bit positions of group number ``group``."""
        return slice(self._offsets[group], self._offsets[group + 1])

    def bit(self, group: int, value: Hashable) -> int:
        """The position of the bit that stands for ``value`` in group number ``group``."""
        try:
            return self._offsets[group] + self._index[group][value]
        except KeyError:
            raise ValueError(
                f"{value!r} is not a value of group {self._names[group]!r}; "
                f"allowed: {list(self._groups[group])}."
            ) from None

    def encode(self, values: Sequence[Hashable]) -> np.ndarray:
        """Bits (``uint8``) for one value per group."""
        if len(values) != len(self._groups):
            raise ValueError(f"Expected {len(self._groups)} values, but got {len(values)}.")
        bits = np.zeros(self.n_bits, dtype=np.uint8)
        for g, value in enumerate(values):
            bits[self.bit(g, value)] = 1
        return bits

    def decode(self, bits: Sequence[int] | np.ndarray) -> list[Hashable]:
        """The value of each group; raises ``ValueError`` unless each group has exactly one bit."""
        array = np.asarray(bits)
        if array.shape != (self.n_bits,):
            raise ValueError(f"Expected {self.n_bits} bits, but got shape {array.shape}.")
        values = []
        for g, name in enumerate(self._names):
            ones = np.flatnonzero(array[self.slice(g)])
            if len(ones) != 1:
                raise ValueError(
                    f"Group {name!r} must have exactly one bit set, but has {len(ones)}."
                )
            values.append(self._groups[g][int(ones[0])])
        return values

    def is_feasible(self, bits: Sequence[int] | np.ndarray) -> bool:
        """Whether every group has exactly one bit set."""
        array = np.asarray(bits)
        return all(int(array[self.slice(g)].sum()) == 1 for g in range(len(self._groups)))
