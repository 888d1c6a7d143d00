"""MNIST-1D (Greydanus 2020, "Scaling down deep learning"), generated on this machine.

The ``mnist1d`` package (extra ``mnist1d``) makes the data set with its own generator from its
own templates; nothing is downloaded. Its default arguments give the published draw: 4,000
training and 1,000 test signals of length 40, 10 classes, from generator seed 42. The paper
reports test accuracy 32 % (logistic regression), 68 % (MLP), 94 % (CNN) and 91 % (GRU).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from optuna_hpcnas.data._arrays import DataError
from optuna_hpcnas.data._arrays import task_from_arrays
from optuna_hpcnas.data._tasks import TaskData

# The package's own default: the draw the paper and its leaderboard use.
PUBLISHED_GENERATOR_SEED = 42


def mnist1d_arrays(generator_seed: int = PUBLISHED_GENERATOR_SEED) -> dict[str, np.ndarray]:
    """``x, y, x_test, y_test`` of MNIST-1D from the package's generator, default arguments
    but the generator seed. The generator seeds Python's and numpy's global random state; both
    are put back afterwards."""
    try:
        from mnist1d.data import get_dataset_args
        from mnist1d.data import make_dataset
    except ImportError:
        raise DataError(
            "[data] name = 'mnist1d' needs the mnist1d package: pip install optuna-hpcnas[mnist1d]"
        ) from None
    args = get_dataset_args()
    args.seed = int(generator_seed)
    # the generator's own global seeding, undone (not a use of the legacy API by this package)
    python_state, numpy_state = random.getstate(), np.random.get_state()  # noqa: NPY002
    try:
        made: dict[str, Any] = make_dataset(args)
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)  # noqa: NPY002
    return {
        "x": np.asarray(made["x"], dtype=np.float32),
        "y": np.asarray(made["y"], dtype=np.int64),
        "x_test": np.asarray(made["x_test"], dtype=np.float32),
        "y_test": np.asarray(made["y_test"], dtype=np.int64),
    }


def load_mnist1d_task(
    *,
    seed: int = 0,
    validation_fraction: float = 0.2,
    generator_seed: int = PUBLISHED_GENERATOR_SEED,
    normalize: bool = True,
) -> TaskData:
    """MNIST-1D as ``(40, 1)`` sequences: the package's training set split into train and
    validation (stratified, ``validation_fraction``, fixed by ``seed``), its test set as test.

    Examples:
        >>> data = load_mnist1d_task()  # doctest: +SKIP
        >>> data.input_shape, data.num_classes, data.sizes  # doctest: +SKIP
        ((40, 1), 10, (3200, 800, 1000))
    """
    arrays = mnist1d_arrays(generator_seed)
    splits = {"train": (arrays["x"], arrays["y"]), "test": (arrays["x_test"], arrays["y_test"])}
    return task_from_arrays(
        splits,
        name="mnist1d",
        source=f"mnist1d (generator seed {generator_seed})",
        fraction=validation_fraction,
        seed=seed,
        normalize=normalize,
    )
