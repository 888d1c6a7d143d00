"""Deployment targets: what each runtime can execute, as constraints of the search.

A ``TargetProfile`` names the operator families (and single operators) a runtime cannot run,
so ``HierarchicalSearchSpace(target=...)`` never proposes them, and the ONNX-level rules that
``optuna_hpcnas.deploy.check_target`` applies to an exported model. Both views describe the
same runtime: the search removes what deployment would refuse.
"""

from __future__ import annotations

from dataclasses import dataclass

from optuna_hpcnas._validation import check_str
from optuna_hpcnas.search_space._operators import OperatorSpec


@dataclass(frozen=True)
class TargetProfile:
    """What one deployment target can run.

    Args:
        name: Profile name, e.g. ``"onnx-cpu"``.
        description: One line for people.
        forbidden_families: Operator families the target cannot run (``OperatorSpec.family``).
        forbidden_operators: Single operators the target cannot run, by registry name (for
            operators whose implementation needs a kernel the target lacks although their
            family is fine).
        grouped_conv: Whether ONNX ``Conv`` nodes with ``group > 1`` (depthwise or grouped
            convolutions) run on the target.
        forbidden_onnx_ops: ONNX operator types the target cannot run.
    """

    name: str
    description: str
    forbidden_families: frozenset[str] = frozenset()
    forbidden_operators: frozenset[str] = frozenset()
    grouped_conv: bool = True
    forbidden_onnx_ops: frozenset[str] = frozenset()

    def allows(self, spec: OperatorSpec) -> bool:
        """Whether the target can run the operator ``spec``."""
        return (
            spec.family not in self.forbidden_families
            and spec.name not in self.forbidden_operators
        )


def _profiles() -> tuple[TargetProfile, ...]:
    return (
        TargetProfile(
            "onnx-cpu",
            "onnxruntime on CPU (FP32 and INT8 QDQ): runs every built-in operator",
        ),
        TargetProfile(
            "tensorrt",
            "NVIDIA TensorRT through its ONNX parser: runs every built-in operator",
            # Sequence, string and optional types are outside TensorRT's tensor-only parser.
            forbidden_onnx_ops=frozenset(
                {
                    "SequenceAt",
                    "SequenceConstruct",
                    "SequenceEmpty",
                    "SequenceInsert",
                    "SplitToSequence",
                    "StringNormalizer",
                    "TfIdfVectorizer",
                    "Optional",
                    "OptionalGetElement",
                    "OptionalHasElement",
                }
            ),
        ),
        TargetProfile(
            "npu-no-grouped",
            "an NPU without grouped or depthwise convolutions",
            forbidden_families=frozenset({"sepconv", "dilconv"}),
            # The supernet runs 3x3 average pooling as a depthwise box convolution (faster on
            # CPU than avg_pool2d), so its export holds a grouped Conv as well.
            forbidden_operators=frozenset({"avgpool3x3"}),
            grouped_conv=False,
        ),
    )


def target_names() -> tuple[str, ...]:
    """The names of the built-in deployment targets."""
    return tuple(p.name for p in _profiles())


def target_profile(name: str) -> TargetProfile:
    """The built-in profile called ``name``; an unknown name raises ``ValueError``.

    Examples:
        >>> target_profile("npu-no-grouped").grouped_conv
        False
    """
    check_str("target", name)
    for profile in _profiles():
        if profile.name == name:
            return profile
    raise ValueError(f"Unknown deployment target {name!r}; available: {list(target_names())}.")
