"""User data sets for the search: ``.npz`` arrays, image folders, CIFAR-10 files, factories.

``load_task(config)`` turns a ``[data]`` table (``optuna_hpcnas.config.DataConfig``) into a
``TaskData``; the supernet takes its input shape and class count from it. Every problem with
the files (missing, wrong array names, mismatched lengths, labels out of range, a file that
is not an image) raises ``DataError`` naming the file and the problem. Nothing is downloaded
and nothing is unpickled without a whitelist: CIFAR-10's binary batches are read with numpy,
its Python batches with an unpickler that only admits the numpy array constructor.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
import pickle
from typing import Any
import warnings
import zipfile

import numpy as np
from torch.utils.data import TensorDataset

from optuna_hpcnas._imports import import_object
from optuna_hpcnas.data._arrays import DataError
from optuna_hpcnas.data._arrays import Splits
from optuna_hpcnas.data._arrays import task_from_arrays
from optuna_hpcnas.data._tasks import load_digits_task
from optuna_hpcnas.data._tasks import make_sequence_task
from optuna_hpcnas.data._tasks import TaskData

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".ppm", ".pgm", ".tif")
NPZ_ARRAYS = ("x_train", "y_train", "x_valid", "y_valid", "x_test", "y_test")


def load_task(config: Any) -> TaskData:
    """The ``TaskData`` a ``DataConfig`` describes (see ``optuna_hpcnas.config.DataConfig``).

    Every problem of the data is a ``DataError`` naming it: the readers' own, a file the
    system cannot read (``OSError``), a sample or label ``TaskData.check`` refuses.
    """
    try:
        task = _load(config)
        task.check()
    except DataError:
        raise
    except (OSError, ValueError) as e:
        raise DataError(str(e)) from None
    return task


def _load(config: Any) -> TaskData:
    v = config.validation_fraction
    if config.factory is not None:
        task = _from_factory(config.factory, seed=config.seed, kwargs=config.factory_kwargs)
    elif config.name == "digits":
        task = load_digits_task(seed=config.seed, fractions=(1 - 2 * v, v, v))
    elif config.name == "sequence":
        task = make_sequence_task(seed=config.seed)
    elif config.name == "mnist1d":
        from optuna_hpcnas.data._mnist1d import load_mnist1d_task
        from optuna_hpcnas.data._mnist1d import PUBLISHED_GENERATOR_SEED

        task = load_mnist1d_task(
            seed=config.seed,
            validation_fraction=v,
            generator_seed=(
                PUBLISHED_GENERATOR_SEED
                if config.generator_seed is None
                else config.generator_seed
            ),
            normalize=config.normalize,
        )
    elif config.name == "aeon":
        from optuna_hpcnas.data._aeon import aeon_splits

        splits, source = aeon_splits(
            dataset=config.dataset,
            path=config.path,
            unequal_length=config.unequal_length,
            missing=config.missing,
        )
        task = task_from_arrays(
            splits,
            name=config.dataset or Path(source).stem.replace("_TRAIN", ""),
            source=source,
            fraction=v,
            seed=config.seed,
            normalize=config.normalize,
        )
    else:
        splits = {
            "npz": lambda: _npz_splits(Path(config.path)),
            "image_folder": lambda: _image_folder_splits(Path(config.root), config.image_size),
            "cifar10": lambda: _cifar10_splits(Path(config.root)),
        }[config.name]()
        task = task_from_arrays(
            splits,
            name=config.name,
            source=str(config.path or config.root),
            fraction=v,
            seed=config.seed,
            normalize=config.normalize,
        )
    if config.max_samples is not None and len(task.train) > config.max_samples:  # type: ignore[arg-type]
        task = _limit(task, config.max_samples)
    return task


def _from_factory(spec: str, *, seed: int, kwargs: dict[str, Any]) -> TaskData:
    try:
        target = import_object(spec)
    except ValueError as e:
        raise DataError(f"[data] factory {e}") from None
    task = target(seed=seed, **kwargs)
    if not isinstance(task, TaskData):
        raise DataError(
            f"[data] factory {spec!r} returned a {type(task).__name__}, but must return an "
            "optuna_hpcnas.data.TaskData."
        )
    return task


def _limit(task: TaskData, n: int) -> TaskData:
    x, y = task.train.tensors  # type: ignore[attr-defined]
    from dataclasses import replace

    return replace(task, train=TensorDataset(x[:n], y[:n]))


# ---------------------------------------------------------------------------- npz
def _npz_splits(path: Path) -> Splits:
    if not path.is_file():
        raise DataError(f"{path}: no such .npz file.")
    try:
        members = _npz_members(path)
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise DataError(f"{path}: not a readable .npz archive ({e}).") from None
    names = set(members)
    unknown = sorted(names - set(NPZ_ARRAYS))
    if unknown or not {"x_train", "y_train"} <= names:
        raise DataError(
            f"{path}: holds arrays {sorted(names)}; expected x_train and y_train, "
            f"optionally x_valid/y_valid and x_test/y_test"
            + (f" (unknown: {unknown})" if unknown else "")
            + "."
        )
    for name, (dtype, shape, stored) in members.items():
        if dtype.hasobject:
            raise DataError(
                f"{path}: array {name} holds Python objects ({dtype}); only numeric arrays "
                "are read (nothing is unpickled)."
            )
        claimed = dtype.itemsize * math.prod(shape)
        if claimed > stored:
            raise DataError(
                f"{path}: array {name} claims shape {shape} of {dtype} ({claimed:,} bytes), "
                f"but the archive holds {stored:,} bytes for it."
            )
    splits: Splits = {}
    try:
        with np.load(path, allow_pickle=False) as archive:
            for split in ("train", "valid", "test"):
                xs, ys = f"x_{split}", f"y_{split}"
                if (xs in names) != (ys in names):
                    raise DataError(f"{path}: has {xs if xs in names else ys} without its pair.")
                if xs in names:
                    splits[split] = (archive[xs], archive[ys])
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise DataError(f"{path}: not a readable .npz archive ({e}).") from None
    return splits


def _npz_members(path: Path) -> dict[str, tuple[np.dtype, tuple[int, ...], int]]:
    """``name -> (dtype, shape, uncompressed bytes)`` of every array of an ``.npz``, read from
    the ``.npy`` headers alone: a header may claim any shape, so nothing is allocated (or
    unpickled) before the claim is checked against what the archive holds."""
    out = {}
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if not info.filename.endswith(".npy"):
                raise ValueError(f"member {info.filename!r} is not a .npy array")
            with archive.open(info) as member:
                version = np.lib.format.read_magic(member)
                if version == (1, 0):
                    shape, _, dtype = np.lib.format.read_array_header_1_0(member)
                elif version == (2, 0):
                    shape, _, dtype = np.lib.format.read_array_header_2_0(member)
                else:
                    raise ValueError(f"member {info.filename!r} is a .npy of version {version}")
                body = info.file_size - member.tell()
            out[info.filename[: -len(".npy")]] = (np.dtype(dtype), tuple(shape), body)
    return out


# ---------------------------------------------------------------------------- image folders
def _image_folder_splits(root: Path, size: tuple[int, int] | None) -> Splits:
    """torchvision's ``ImageFolder`` layout, read with Pillow (torchvision's wheels do not
    match the CPU torch build pinned here, and the layout is simple)."""
    if not root.is_dir():
        raise DataError(f"{root}: no such image folder.")
    train = root / "train"
    if not train.is_dir():
        raise DataError(f"{root}: has no train/ directory (expected root/train/<class>/*.png).")
    classes = sorted(p.name for p in train.iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(classes) < 2:
        raise DataError(f"{train}: has {len(classes)} class folder(s); need >= 2.")
    splits: Splits = {}
    fixed = size  # the first image's size when none is given, and every other must match
    for split, folder in (("train", "train"), ("valid", "val"), ("test", "test")):
        directory = root / folder
        if directory.is_dir():
            splits[split], fixed = _read_images(directory, classes, fixed, resize=size is not None)
    return splits


def _read_images(
    directory: Path, classes: list[str], size: tuple[int, int] | None, *, resize: bool
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[int, int]]:
    from PIL import Image
    from PIL import UnidentifiedImageError

    xs, ys = [], []
    for sub in sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if sub.name not in classes:
            raise DataError(f"{sub}: class {sub.name!r} is not a class of train/ {classes}.")
        for file in sorted(f for f in sub.iterdir() if f.is_file() and not f.name.startswith(".")):
            try:
                with warnings.catch_warnings():
                    # Pillow only warns between its pixel limit and twice it: refuse those too
                    warnings.simplefilter("error", Image.DecompressionBombWarning)
                    with Image.open(file) as image:
                        image.load()
                        mode = "L" if image.mode in ("L", "1", "I;16", "I") else "RGB"
                        picture = image.convert(mode)
            except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
                raise DataError(f"{file}: refused, a decompression bomb ({e}).") from None
            except (UnidentifiedImageError, OSError, ValueError) as e:
                raise DataError(f"{file}: not an image ({type(e).__name__}).") from None
            if size is None:
                size = (picture.height, picture.width)
            height, width = size
            if picture.size != (width, height):
                if not resize:
                    raise DataError(
                        f"{file}: is {picture.height}x{picture.width}, but the first image is "
                        f"{height}x{width}; set [data] image_size = [h, w] to resize."
                    )
                picture = picture.resize((width, height))
            array = np.asarray(picture, dtype=np.float32) / 255.0
            xs.append(array[None] if array.ndim == 2 else array.transpose(2, 0, 1))
            ys.append(classes.index(sub.name))
    if not xs or size is None:
        raise DataError(f"{directory}: holds no image.")
    if len({x.shape[0] for x in xs}) > 1:  # grey and colour mixed: all colour
        xs = [np.repeat(x, 3, axis=0) if x.shape[0] == 1 else x for x in xs]
    return (np.stack(xs), np.asarray(ys, dtype=np.int64)), size


# ---------------------------------------------------------------------------- CIFAR-10
def _cifar10_splits(root: Path) -> Splits:
    """CIFAR-10 already on disk: the binary version (``cifar-10-batches-bin``) or
    torchvision's Python version (``cifar-10-batches-py``); the test batch is the test split."""
    for base in (root, root / "cifar-10-batches-bin", root / "cifar-10-batches-py"):
        if (base / "data_batch_1.bin").is_file():
            read, suffix = _cifar_binary, ".bin"
            break
        if (base / "data_batch_1").is_file():
            read, suffix = _cifar_python, ""
            break
    else:
        raise DataError(
            f"{root}: no CIFAR-10 files (data_batch_1.bin or data_batch_1, in root, "
            "cifar-10-batches-bin/ or cifar-10-batches-py/); nothing is downloaded."
        )
    train = [read(base / f"data_batch_{i}{suffix}") for i in range(1, 6)]
    x = np.concatenate([t[0] for t in train])
    y = np.concatenate([t[1] for t in train])
    return {"train": (x, y), "test": read(base / f"test_batch{suffix}")}


def _cifar_binary(path: Path) -> tuple[np.ndarray, np.ndarray]:
    if not path.is_file():
        raise DataError(f"{path}: missing CIFAR-10 batch.")
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size % 3073:
        raise DataError(f"{path}: {raw.size} bytes is not a whole number of CIFAR-10 records.")
    records = raw.reshape(-1, 3073)
    x = records[:, 1:].reshape(-1, 3, 32, 32).astype(np.float32) / 255.0
    return x, records[:, 0].astype(np.int64)


class _ArrayUnpickler(pickle.Unpickler):
    """Admits only what a CIFAR batch holds (dicts, lists, bytes, numpy arrays)."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a CIFAR batch")
        return super().find_class(module, name)


def _cifar_python(path: Path) -> tuple[np.ndarray, np.ndarray]:
    if not path.is_file():
        raise DataError(f"{path}: missing CIFAR-10 batch.")
    try:
        batch = _ArrayUnpickler(io.BytesIO(path.read_bytes()), encoding="bytes").load()
        data = np.asarray(batch[b"data"], dtype=np.uint8)
        labels = np.asarray(batch[b"labels"], dtype=np.int64)
    except (pickle.UnpicklingError, KeyError, TypeError, EOFError, ValueError) as e:
        raise DataError(f"{path}: not a CIFAR-10 batch ({e}).") from None
    return data.reshape(-1, 3, 32, 32).astype(np.float32) / 255.0, labels
