from .sampler import EvolutionarySampler


__all__ = ["EvolutionarySampler"]
