"""``[sampler]``: the one factory of the samplers a search names (``hpcnas run``, the demo,
the storage load test), with one set of names."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from typing import Any
from typing import TYPE_CHECKING

from optuna_hpcnas._validation import check_choice
from optuna_hpcnas._validation import check_seed
from optuna_hpcnas._validation import check_table
from optuna_hpcnas._validation import ConfigError

if TYPE_CHECKING:
    import optuna

SAMPLERS = ("tpe", "random", "nsga2", "gp", "evolutionary", "qubo")


@dataclass(frozen=True)
class SamplerConfig:
    """``[sampler]``: ``name`` and ``seed``; ``kwargs`` go to the sampler's constructor."""

    name: str = "evolutionary"
    seed: int | None = None
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_choice("name", self.name, SAMPLERS)
        check_seed("seed", self.seed, allow_none=True)
        check_table("kwargs", self.kwargs)
        object.__setattr__(self, "kwargs", dict(self.kwargs))

    def build(self, *, seed_offset: int = 0) -> optuna.samplers.BaseSampler:
        """The Optuna sampler (each group leader adds its group index to the seed, so
        leaders do not propose the same candidates)."""
        import optuna

        seed = None if self.seed is None else self.seed + seed_offset
        kwargs = dict(self.kwargs)
        builtin = {
            "tpe": optuna.samplers.TPESampler,
            "random": optuna.samplers.RandomSampler,
            "nsga2": optuna.samplers.NSGAIISampler,
            "gp": optuna.samplers.GPSampler,
        }
        try:
            if self.name in builtin:
                return builtin[self.name](seed=seed, **kwargs)
            if self.name == "evolutionary":
                from optuna_hpcnas.samplers._evolution import EvolutionarySampler

                return EvolutionarySampler(seed=seed, **kwargs)
            from optuna_hpcnas.samplers._qubo import QUBOSampler

            return QUBOSampler(seed=seed, **kwargs)
        except ImportError as e:
            raise ConfigError(
                f"[sampler] name = {self.name!r} needs a missing package: {e}."
            ) from None
        except TypeError as e:
            raise ConfigError(f"[sampler] kwargs: {e}") from None
