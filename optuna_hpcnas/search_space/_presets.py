"""Named search spaces.

* ``digits-small`` — 8x8 images (scikit-learn's digits); 3 cells, 1,536 architectures: small
  enough to enumerate, to train exhaustively for a tabular benchmark, and for the QUBO sampler.
* ``cifar-like`` — 32x32 images; 8 cells with convolutions, attention and transformer blocks,
  and a searched cluster layout (about 10^12 architectures).
* ``sequence`` — token sequences; transformer, self-attention, conv1d and identity cells.
* ``signal-1d`` — 1-D signals ``(L, F)`` such as MNIST-1D: strided and dilated Conv1d with
  BatchNorm, plain Conv1d, stride-2 pooling, a bidirectional GRU, attention and transformer
  cells; the raw, embedded or flattened signal as stem; mean or flatten head. The MNIST-1D
  paper's MLP, CNN and GRU are points of it (``SIGNAL_1D_PAPER_MODELS``), and so is the
  time-series classification baseline FCN (``SIGNAL_1D_BASELINES``).
* ``signal-elastic`` — 1-D signals, nested for weight sharing (Once-for-All, BigNAS): every
  cell a Conv1d-BatchNorm-ReLU of searched width, kernel and stride, or skipped (depth); chain
  or residual; every subnet is a slice of the largest (the widest, deepest, largest kernels),
  so the supernet's weights rank its subnets. The FCN and a ResNet-1D are points of it
  (``SIGNAL_ELASTIC_BASELINES``).
* ``digits-elastic`` — small images, nested the same way: 4 cells of 3x3 or 5x5 convolution of
  width 16 or 32, or skipped; chain or residual (1,250 architectures, enumerable).
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
    "signal-1d": {
        "num_cells": 4,
        "operators": (
            "conv1d_bn",
            "dilconv1d_bn",
            "conv1d_plain",
            "maxpool1d",
            "gru",
            "attention",
            "transformer",
            "identity",
        ),
        "topologies": ("chain", "residual", "dense"),
        "stems": ("none", "embed", "flatten"),
        "heads": ("mean", "flatten"),
        # 25 and 100 are the paper's CNN and MLP widths, 12 its GRU's (6 units each way)
        "widths": (12, 25, 50, 100),
        "kernel_sizes": (1, 3, 5, 7),
        "strides": (1, 2),
        "expansion_ratios": (2, 4),
        "num_heads": (1, 2, 4),
        "data_parallel": (1, 2),
        "pipeline_stages": (1, 2),
        "micro_batch_sizes": (32, 64),
        "domain": "sequence",
    },
    "signal-elastic": {
        "num_cells": 6,
        "operators": ("conv1d_bn", "identity"),
        "topologies": ("chain", "residual"),
        "stems": ("none",),
        "heads": ("mean",),
        "widths": (32, 64, 128),
        "kernel_sizes": (3, 5, 7),
        "strides": (1, 2),
        "data_parallel": (1, 2),
        "pipeline_stages": (1, 2),
        "micro_batch_sizes": (32, 64),
        "domain": "sequence",
    },
    "digits-elastic": {
        "num_cells": 4,
        "operators": ("conv", "identity"),
        "topologies": ("chain", "residual"),
        "widths": (16, 32),
        "kernel_sizes": (3, 5),
        "data_parallel": (1,),
        "pipeline_stages": (1,),
        "micro_batch_sizes": (64,),
        "domain": "image",
    },
}

# The models of Greydanus (2020), "Scaling down deep learning", Table 1, as parameters of the
# ``signal-1d`` space (chain topology; one process's cluster layout). Their parameter counts
# equal the paper code's (MLP 15,210; CNN 5,210; GRU 5,134). The CNN pads every convolution
# by (k - 1) // 2 where the paper pads its 5-wide one by 1: lengths 40 -> 20 -> 10 -> 5
# instead of 40 -> 19 -> 10 -> 5, the same 125 features before the head.
_LAYOUT = {
    "cluster.data_parallel": 1,
    "cluster.pipeline_stages": 1,
    "cluster.micro_batch_size": 32,
}
SIGNAL_1D_PAPER_MODELS: dict[str, dict[str, Any]] = {
    # Linear(40, 100), ReLU, Linear(100, 100), ReLU, Linear(100, 10)
    "mlp": {
        "node.topology": "chain",
        "node.stem": "flatten",
        **{
            f"node.cell{i}.{k}": v
            for i in (0, 1)
            for k, v in (("op", "conv1d_plain"), ("kernel", 1), ("width", 100), ("stride", 1))
        },
        "node.cell2.op": "identity",
        "node.cell3.op": "identity",
        "node.head": "flatten",
        **_LAYOUT,
    },
    # Conv1d(1, 25, 5, stride 2), ReLU, Conv1d(25, 25, 3, stride 2), ReLU, the same again,
    # Linear(125, 10)
    "cnn": {
        "node.topology": "chain",
        "node.stem": "none",
        **{
            f"node.cell{i}.{k}": v
            for i, kernel in ((0, 5), (1, 3), (2, 3))
            for k, v in (("op", "conv1d_plain"), ("kernel", kernel), ("width", 25), ("stride", 2))
        },
        "node.cell3.op": "identity",
        "node.head": "flatten",
        **_LAYOUT,
    },
    # GRU(1, 6, bidirectional) over the 40 positions, Linear(40 * 12, 10)
    "gru": {
        "node.topology": "chain",
        "node.stem": "none",
        "node.cell0.op": "gru",
        "node.cell0.width": 12,
        "node.cell1.op": "identity",
        "node.cell2.op": "identity",
        "node.cell3.op": "identity",
        "node.head": "flatten",
        **_LAYOUT,
    },
}

# The fully convolutional network of Wang, Yan & Oates 2017 ("Time series classification from
# scratch with deep neural networks: a strong baseline"), the standard baseline of time-series
# classification: Conv1d(128, 8), Conv1d(256, 5), Conv1d(128, 3), each with BatchNorm and ReLU,
# then global average pooling and a linear classifier. In the space: the widths capped at its
# widest choice (100) and the 8-wide kernel at 7; same padding, no stride, as in the paper.
SIGNAL_1D_BASELINES: dict[str, dict[str, Any]] = {
    "fcn": {
        "node.topology": "chain",
        "node.stem": "none",
        **{
            f"node.cell{i}.{k}": v
            for i, kernel in ((0, 7), (1, 5), (2, 3))
            for k, v in (("op", "conv1d_bn"), ("kernel", kernel), ("width", 100), ("stride", 1))
        },
        "node.cell3.op": "identity",
        "node.head": "mean",
        **_LAYOUT,
    },
}


def _elastic(topology: str, cells: list[tuple[int, int]]) -> dict[str, Any]:
    """A ``signal-elastic`` point: ``(width, kernel)`` convolutions (stride 1), the rest of
    the six cells skipped."""
    params: dict[str, Any] = {"node.topology": topology, **_LAYOUT}
    for i in range(6):
        if i < len(cells):
            width, kernel = cells[i]
            params.update({
                f"node.cell{i}.op": "conv1d_bn",
                f"node.cell{i}.width": width,
                f"node.cell{i}.kernel": kernel,
                f"node.cell{i}.stride": 1,
            })  # fmt: skip
        else:
            params[f"node.cell{i}.op"] = "identity"
    return params


# The FCN of Wang et al. 2017 (widths 128-256-128 capped at 128, its 8-wide kernel at 7) and a
# ResNet-1D after the same paper's ResNet: two residual stages of kernels 7-5-3, widths 64 and
# 128, a shortcut around every convolution (the paper's goes around every three).
SIGNAL_ELASTIC_BASELINES: dict[str, dict[str, Any]] = {
    "fcn": _elastic("chain", [(128, 7), (128, 5), (128, 3)]),
    "resnet": _elastic("residual", [(64, 7), (64, 5), (64, 3), (128, 7), (128, 5), (128, 3)]),
}

# Published models of each preset, by name: ``[study] enqueue = ["cnn", "fcn"]`` starts a
# search from them (``reference_models``).
REFERENCE_MODELS: dict[str, dict[str, dict[str, Any]]] = {
    "signal-1d": {**SIGNAL_1D_PAPER_MODELS, **SIGNAL_1D_BASELINES},
    "signal-elastic": SIGNAL_ELASTIC_BASELINES,
}


def reference_models(preset: str | None) -> dict[str, dict[str, Any]]:
    """The published models of ``preset`` as Optuna parameters, by name (may be empty)."""
    return dict(REFERENCE_MODELS.get(preset or "", {}))
