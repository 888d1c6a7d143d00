"""Named search spaces.

* ``digits-small`` — 8x8 images (scikit-learn's digits); 3 cells, 1,536 architectures: small
  enough to enumerate, to train exhaustively for a tabular benchmark, and for the QUBO sampler.
* ``cifar-like`` — 32x32 images; 8 cells with convolutions, attention and transformer blocks,
  and a searched cluster layout (about 10^12 architectures).
* ``sequence`` — token sequences; transformer, self-attention, conv1d and identity cells.
"""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    "digits-small": {
        "num_cells": 3,
        "operators": ("conv3x3", "sepconv3x3", "dilconv3x3", "maxpool3x3", "identity"),
        "topologies": ("chain", "residual", "dense"),
        "widths": (16, 32),
        "data_parallel": (1,),
        "pipeline_stages": (1,),
        "micro_batch_sizes": (64,),
        "domain": "image",
    },
    "cifar-like": {
        "num_cells": 8,
        "operators": (
            "conv3x3",
            "conv5x5",
            "sepconv3x3",
            "sepconv5x5",
            "dilconv3x3",
            "maxpool3x3",
            "identity",
            "transformer",
            "attention",
        ),
        "topologies": ("chain", "residual", "dense"),
        "widths": (32, 64, 128),
        "expansion_ratios": (2, 4),
        "num_heads": (2, 4),
        "data_parallel": (1, 2, 4),
        "pipeline_stages": (1, 2, 4),
        "micro_batch_sizes": (32, 64, 128),
        "domain": "image",
    },
    "sequence": {
        "num_cells": 4,
        "operators": ("transformer", "attention", "conv1d", "identity"),
        "topologies": ("chain", "residual", "dense"),
        "widths": (32, 64),
        "kernel_sizes": (3, 5, 7),
        "expansion_ratios": (2, 4),
        "num_heads": (2, 4),
        "data_parallel": (1, 2),
        "pipeline_stages": (1, 2),
        "micro_batch_sizes": (16, 32),
        "domain": "sequence",
    },
}
