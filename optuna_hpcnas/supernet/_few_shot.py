"""Few-shot supernets (Zhao et al. 2021): one supernet split on one decision into a
sub-supernet per choice, so paths that pull the shared weights apart stop sharing them.

``SupernetTrainer`` measures which decision to split on (``decision_disagreement``: the
gradients of the weights every choice uses, compared between the choices, as GM-NAS does),
splits the warmed-up supernet with ``FewShotSuperNet.split`` and goes on training it: a path
runs through the part that owns its choice. The result answers ``forward``, ``subnet``,
``layers``, ``widths`` and ``lengths`` as a ``SuperNet`` does, so scoring, fine-tuning and
export use it unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable
import copy
import itertools
from typing import Any

import numpy as np
import torch
from torch import nn
import torch.nn.functional as F

from optuna_hpcnas.search_space import Architecture
from optuna_hpcnas.search_space import HierarchicalSearchSpace
from optuna_hpcnas.supernet._supernet import SuperNet


def split_candidates(space: HierarchicalSearchSpace, max_parts: int) -> list[str]:
    """The decisions a supernet can be split on: unconditional, non-constant network
    decisions (topology, stem, head, a cell's operator) with at most ``max_parts`` choices."""
    return [
        d.name
        for d in space.decisions
        if d.parent is None
        and not d.is_constant
        and not d.name.startswith("cluster.")
        and len(d.choices) <= max_parts
    ]


def decision_disagreement(
    supernet: SuperNet,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    rng: np.random.Generator,
    *,
    decisions: Iterable[str],
    paths: int = 4,
) -> dict[str, float]:
    """For each decision, ``1 -`` the mean pairwise cosine similarity between its choices'
    gradients of the weights all its choices use (``paths`` paths drawn with the choice fixed,
    on the same ``batches``): 0 when the choices agree on how to move the shared weights, up
    to 2 when they pull them in opposite directions.
    """
    batches = list(batches)
    space = supernet.space
    params = dict(supernet.named_parameters())
    was_training = supernet.training
    supernet.train()
    out: dict[str, float] = {}
    try:
        for name in decisions:
            grads = []
            for choice in space.decision(name).choices:
                supernet.zero_grad(set_to_none=True)
                for x, y in batches:
                    for _ in range(paths):
                        arch = space.sample(rng, fixed={name: choice})
                        loss = F.cross_entropy(supernet(x, arch), y) / (paths * len(batches))
                        loss.backward()
                grads.append(
                    {
                        k: p.grad.detach().flatten().clone()
                        for k, p in params.items()
                        if p.grad is not None
                    }
                )
            shared = sorted(set.intersection(*(set(g) for g in grads)))
            if not shared:
                out[name] = 1.0
                continue
            vectors = [torch.cat([g[k] for k in shared]) for g in grads]
            cosines = [
                float(F.cosine_similarity(a, b, dim=0))
                for a, b in itertools.combinations(vectors, 2)
            ]
            out[name] = 1.0 - float(np.mean(cosines))
    finally:
        supernet.zero_grad(set_to_none=True)
        supernet.train(was_training)
    return out


def _prune(part: SuperNet, decision: str, choice: Any) -> None:
    """Drop from ``part`` the modules only other choices of ``decision`` use."""
    if decision == "node.stem":
        for key in [k for k in part.stems if k != str(choice)]:
            del part.stems[key]
    elif decision == "node.head":
        for key in [k for k in part.heads if k != str(choice)]:
            del part.heads[key]
    elif decision == "node.topology":
        if choice != "dense":
            part.projections = nn.ModuleDict()
    elif decision.startswith("node.cell") and decision.endswith(".op"):
        cell = part.cells[int(decision[len("node.cell") : -len(".op")])]
        assert isinstance(cell, nn.ModuleDict)
        for key in [k for k in cell if k != str(choice)]:
            del cell[key]
    else:
        raise ValueError(f"A supernet cannot be split on {decision!r}.")


class FewShotSuperNet(nn.Module):
    """Sub-supernets, one per choice of ``decision``, each a pruned copy of one supernet.

    Args:
        parts: One ``SuperNet`` per choice, in the order of the decision's choices.
        decision: The decision the parts split.

    Examples:
        >>> from optuna_hpcnas import HierarchicalSearchSpace
        >>> space = HierarchicalSearchSpace.preset("digits-small")
        >>> net = SuperNet(space, input_shape=(1, 8, 8), num_classes=10)
        >>> few = FewShotSuperNet.split(net, "node.topology")
        >>> len(few.parts), sorted(few.parts[2].projections) != []
        (3, True)
    """

    def __init__(self, parts: Iterable[SuperNet], decision: str) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)
        first = self.parts[0]
        assert isinstance(first, SuperNet)
        self.space = first.space
        self.decision = decision
        self.choices = self.space.decision(decision).choices
        if len(self.parts) != len(self.choices):
            raise ValueError(
                f"{len(self.parts)} parts for the {len(self.choices)} choices of {decision!r}."
            )
        self.domain = first.domain
        self.input_shape = first.input_shape
        self.num_classes = first.num_classes
        self.seed = first.seed
        self.channels = first.channels
        self.stem_widths = first.stem_widths

    @classmethod
    def split(cls, supernet: SuperNet, decision: str) -> FewShotSuperNet:
        """One copy of ``supernet`` per choice of ``decision`` (its weights as they are),
        each without the modules of the other choices."""
        if decision not in split_candidates(supernet.space, max_parts=1 << 30):
            raise ValueError(
                f"`few_shot` is {decision!r}, but a supernet splits on one of "
                f"{split_candidates(supernet.space, max_parts=1 << 30)}."
            )
        parts = []
        for choice in supernet.space.decision(decision).choices:
            part = copy.deepcopy(supernet)
            _prune(part, decision, choice)
            parts.append(part)
        return cls(parts, decision)

    def part(self, arch: Architecture) -> SuperNet:
        """The sub-supernet that owns ``arch``."""
        value = self.space.to_params(arch)[self.decision]
        part = self.parts[self.choices.index(value)]
        assert isinstance(part, SuperNet)
        return part

    def forward(self, x: torch.Tensor, arch: Architecture) -> torch.Tensor:
        return self.part(arch)(x, arch)

    def check_architecture(self, arch: Architecture) -> None:
        self.parts[0].check_architecture(arch)  # type: ignore[operator]

    def check_input(self, x: torch.Tensor) -> None:
        self.parts[0].check_input(x)  # type: ignore[operator]

    def lengths(self, arch: Architecture) -> list[int]:
        return self.part(arch).lengths(arch)

    def widths(self, arch: Architecture) -> list[int]:
        return self.part(arch).widths(arch)

    def layers(self, arch: Architecture) -> list[nn.Module]:
        return self.part(arch).layers(arch)

    def subnet(self, arch: Architecture) -> nn.Sequential:
        return self.part(arch).subnet(arch)
