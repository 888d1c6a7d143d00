"""Does an exported model run on its deployment target? The ONNX-level half of the target
profiles of ``optuna_hpcnas.search_space`` (the search-space half removes the operators).
"""

from __future__ import annotations

from pathlib import Path

from optuna_hpcnas.search_space import target_profile


def _tensorrt_problems(onnx_path: Path) -> list[str]:
    """Problems TensorRT's own ONNX parser reports; nothing when TensorRT or CUDA is absent."""
    try:
        import tensorrt as trt
        import torch

        if not torch.cuda.is_available():
            return []
    except ImportError:
        return []
    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if parser.parse(onnx_path.read_bytes()):
        return []
    return [f"TensorRT: {parser.get_error(i).desc()}" for i in range(parser.num_errors)]


def tensorrt_available() -> bool:
    """Whether a CUDA device and the ``tensorrt`` package are both present."""
    try:
        import tensorrt  # noqa: F401
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def check_target(onnx_path: str | Path, target: str) -> list[str]:
    """Problems that stop the ONNX model at ``onnx_path`` from running on ``target``.

    Checks every node of the graph against the target profile (operator types it lacks;
    ``Conv`` with ``group > 1`` where grouped and depthwise convolutions are missing), then
    that onnxruntime loads and runs the model on CPU (every target is also served by
    ``hpcnas serve``), and, for ``tensorrt`` where TensorRT and a CUDA device exist, that
    TensorRT's ONNX parser accepts it.

    Returns:
        One message per problem; an empty list when the model fits the target.

    Examples:
        >>> check_target("model.onnx", "npu-no-grouped")  # doctest: +SKIP
        ["node 'node_Conv_190' (Conv) has group=32: target 'npu-no-grouped' runs no grouped
        or depthwise convolutions"]
    """
    import numpy as np
    import onnx

    profile = target_profile(target)  # unknown names raise
    path = Path(onnx_path)
    if not path.is_file():
        raise FileNotFoundError(f"No ONNX model at {str(path)!r}.")
    try:
        model = onnx.load(str(path))
    except Exception as e:  # protobuf's DecodeError and onnx's own errors
        return [f"{str(path)!r} is not a readable ONNX model: {type(e).__name__}: {e}"]
    problems: list[str] = []
    for node in model.graph.node:
        if node.op_type in profile.forbidden_onnx_ops:
            problems.append(
                f"node {node.name!r} is {node.op_type}, which target {target!r} cannot run"
            )
        if node.op_type == "Conv" and not profile.grouped_conv:
            group = next((a.i for a in node.attribute if a.name == "group"), 1)
            if group > 1:
                problems.append(
                    f"node {node.name!r} (Conv) has group={group}: target {target!r} runs no "
                    "grouped or depthwise convolutions"
                )
    from optuna_hpcnas.evaluation._onnx import session

    try:
        sess = session(path)
        inp = sess.get_inputs()[0]
        shape = [1 if not isinstance(d, int) else d for d in inp.shape]
        sess.run(None, {inp.name: np.zeros(shape, dtype=np.float32)})
    except Exception as e:  # onnxruntime raises its own exception types per failure
        problems.append(f"onnxruntime cannot run the model: {type(e).__name__}: {e}")
    if target == "tensorrt":
        problems.extend(_tensorrt_problems(path))
    return problems
