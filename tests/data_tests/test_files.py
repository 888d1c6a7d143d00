"""User data sets for ``hpcnas run``: npz, image folders, CIFAR-10 files, factories."""

from __future__ import annotations

from pathlib import Path
import pickle

import numpy as np
import pytest

from optuna_hpcnas.config import config_from_dict
from optuna_hpcnas.config import ConfigError
from optuna_hpcnas.config import DataConfig
from optuna_hpcnas.data import DataError
from optuna_hpcnas.data import TaskData


def _arrays(n: int, shape: tuple[int, ...], classes: int, seed: int = 0) -> tuple:
    rng = np.random.default_rng(seed)
    y = rng.integers(classes, size=n)
    x = rng.normal(size=(n, *shape)).astype(np.float32) + y.reshape(-1, *[1] * len(shape))
    return x, y


def test_npz_with_every_split(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    xt, yt = _arrays(60, (1, 6, 6), 3)
    xv, yv = _arrays(20, (1, 6, 6), 3, seed=1)
    xs, ys = _arrays(20, (1, 6, 6), 3, seed=2)
    np.savez(path, x_train=xt, y_train=yt, x_valid=xv, y_valid=yv, x_test=xs, y_test=ys)
    task = DataConfig(name="npz", path=str(path)).load()
    assert isinstance(task, TaskData)
    assert task.sizes == (60, 20, 20) and task.input_shape == (1, 6, 6)
    assert task.num_classes == 3 and task.domain == "image"
    x, _ = task.train.tensors  # standardised with the train statistics
    assert abs(float(x.mean())) < 1e-4 and float(x.std()) == pytest.approx(1.0, abs=1e-2)


def test_npz_without_valid_and_test_is_split(tmp_path: Path) -> None:
    path = tmp_path / "seq.npz"
    x, y = _arrays(100, (12, 4), 2)
    np.savez(path, x_train=x, y_train=y)
    task = DataConfig(name="npz", path=str(path), validation_fraction=0.2).load()
    assert task.sizes == (60, 20, 20) and task.domain == "sequence"
    assert task.input_shape == (12, 4)


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"x": np.zeros((4, 1, 2, 2)), "y": np.zeros(4)}, r"expected x_train and y_train"),
        ({"x_train": np.zeros((5, 1, 2, 2)), "y_train": np.zeros(4, int)}, r"5 samples but 4"),
        ({"x_train": np.zeros((4, 1, 2, 2)), "y_train": np.array([0, 1, -1, 0])}, r"-1"),
        ({"x_train": np.zeros((4, 1, 2, 2)), "y_train": np.zeros(4)}, r"integer array"),
        (
            {
                "x_train": np.zeros((4, 1, 2, 2)),
                "y_train": np.zeros(4, int),
                "x_test": np.zeros((2, 1, 2, 2)),
            },
            r"without its pair",
        ),
        ({"x_train": np.full((4, 1, 2, 2), np.nan), "y_train": np.arange(4) % 2}, r"NaN"),
        (
            {
                "x_train": np.zeros((4, 3)),
                "y_train": np.arange(4) % 2,
                "x_valid": np.zeros((2, 4)),
                "y_valid": np.arange(2),
                "x_test": np.zeros((2, 3)),
                "y_test": np.arange(2),
            },
            r"valid samples have shape \(4, 1\)",
        ),
    ],
)
def test_bad_npz_names_the_file_and_the_problem(
    tmp_path: Path, arrays: dict, message: str
) -> None:
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(DataError, match=message) as info:
        DataConfig(name="npz", path=str(path)).load()
    assert str(path) in str(info.value)


def test_npz_signals_of_one_or_several_features(tmp_path: Path) -> None:
    for shape, expected in (((40,), (40, 1)), ((40, 3), (40, 3))):
        path = tmp_path / f"signals{len(shape)}.npz"
        x, y = _arrays(120, shape, 4)
        np.savez(path, x_train=x, y_train=y)
        task = DataConfig(name="npz", path=str(path), validation_fraction=0.25).load()
        assert task.domain == "sequence" and task.input_shape == expected
        assert sum(task.sizes) == 120 and task.sizes[2] == 30


def _npy_bytes(header: dict, body: bytes) -> bytes:
    import io

    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, header)
    return out.getvalue() + body


def test_hostile_npz_files_are_refused_before_anything_is_allocated(tmp_path: Path) -> None:
    import zipfile

    objects = tmp_path / "objects.npz"
    np.savez(objects, x_train=np.array([{"a": 1}, None], dtype=object), y_train=np.arange(2))
    with pytest.raises(DataError, match="holds Python objects"):
        DataConfig(name="npz", path=str(objects)).load()

    # a header claiming 8 TB of float64 over 80 bytes of data
    huge = tmp_path / "huge.npz"
    claim = {"descr": "<f8", "fortran_order": False, "shape": (10**12,)}
    with zipfile.ZipFile(huge, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("x_train.npy", _npy_bytes(claim, bytes(80)))
        labels = {"descr": "<i8", "fortran_order": False, "shape": (10,)}
        archive.writestr("y_train.npy", _npy_bytes(labels, bytes(80)))
    with pytest.raises(DataError, match=r"claims shape \(1000000000000,\)"):
        DataConfig(name="npz", path=str(huge)).load()

    stray = tmp_path / "stray.npz"
    with zipfile.ZipFile(stray, "w") as archive:
        archive.writestr("x_train.npy", b"junk")
        archive.writestr("notes.txt", b"hello")
    with pytest.raises(DataError, match="not a readable .npz"):
        DataConfig(name="npz", path=str(stray)).load()


def _png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width x height`` grey pixels (no image data)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


@pytest.mark.parametrize("side", [10_000, 30_000])  # over Pillow's limit; over twice it
def test_decompression_bombs_are_refused(tmp_path: Path, side: int) -> None:
    _image_folder(tmp_path, sizes={"train": 2})
    (tmp_path / "train" / "cat" / "bomb.png").write_bytes(_png_header(side, side))
    with pytest.raises(DataError, match="decompression bomb"):
        DataConfig(name="image_folder", root=str(tmp_path)).load()


def test_mnist1d_is_generated_here_as_published() -> None:
    pytest.importorskip("mnist1d")
    import random

    from mnist1d.data import get_dataset_args
    from mnist1d.data import make_dataset

    random.seed(3)
    np.random.seed(3)  # noqa: NPY002 - the generator's global state must be left alone
    before = (random.random(), np.random.random())  # noqa: NPY002
    random.seed(3)
    np.random.seed(3)  # noqa: NPY002
    task = DataConfig(name="mnist1d").load()
    assert (random.random(), np.random.random()) == before  # noqa: NPY002
    assert task.name == "mnist1d" and task.domain == "sequence"
    assert task.input_shape == (40, 1) and task.num_classes == 10
    assert task.sizes == (3200, 800, 1000)
    published = make_dataset(get_dataset_args())  # seed 42, the package's default
    x_test, y_test = task.test.tensors
    mean, std = task.preprocessing["mean"][0], task.preprocessing["std"][0]
    raw = x_test[:, :, 0].numpy() * std + mean
    assert np.allclose(raw, published["x_test"], atol=1e-4)
    assert np.array_equal(y_test.numpy(), published["y_test"])
    other = DataConfig(name="mnist1d", generator_seed=7).load()
    assert not np.allclose(other.test.tensors[0].numpy(), x_test.numpy())
    with pytest.raises(ValueError, match="generator_seed"):
        DataConfig(name="digits", generator_seed=7)


def test_missing_or_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such .npz file"):
        DataConfig(name="npz", path=str(tmp_path / "none.npz")).load()
    (tmp_path / "text.npz").write_text("not numpy")
    with pytest.raises(DataError, match="not a readable .npz"):
        DataConfig(name="npz", path=str(tmp_path / "text.npz")).load()
    with pytest.raises(DataError, match="no such image folder"):
        DataConfig(name="image_folder", root=str(tmp_path / "nope")).load()
    with pytest.raises(DataError, match="no CIFAR-10 files"):
        DataConfig(name="cifar10", root=str(tmp_path)).load()


def _image_folder(root: Path, *, sizes: dict[str, int], size: int = 8) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in sizes.items():
        for label, name in enumerate(("cat", "dog")):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(n):
                pixels = rng.integers(0, 255, size=(size, size, 3), dtype=np.uint8)
                pixels[..., label] = 255  # the class is visible in one channel
                Image.fromarray(pixels).save(folder / f"{i}.png")


def test_image_folder_layout(tmp_path: Path) -> None:
    _image_folder(tmp_path, sizes={"train": 10, "test": 3})
    task = DataConfig(name="image_folder", root=str(tmp_path)).load()
    assert task.input_shape == (3, 8, 8) and task.num_classes == 2
    assert len(task.test) == 6 and len(task.train) + len(task.valid) == 20
    resized = DataConfig(name="image_folder", root=str(tmp_path), image_size=(4, 4)).load()
    assert resized.input_shape == (3, 4, 4)


def test_image_folder_errors(tmp_path: Path) -> None:
    _image_folder(tmp_path, sizes={"train": 3})
    (tmp_path / "train" / "cat" / "notes.txt").write_text("not an image")
    with pytest.raises(DataError, match=r"notes.txt: not an image"):
        DataConfig(name="image_folder", root=str(tmp_path)).load()
    (tmp_path / "train" / "cat" / "notes.txt").unlink()
    from PIL import Image

    Image.new("RGB", (5, 5)).save(tmp_path / "train" / "dog" / "small.png")
    with pytest.raises(DataError, match=r"small.png: is 5x5.*image_size"):
        DataConfig(name="image_folder", root=str(tmp_path)).load()


def _cifar_records(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    records = rng.integers(0, 255, size=(n, 3073), dtype=np.uint8)
    records[:, 0] = np.arange(n) % 10
    return records


def test_cifar10_binary_and_python_batches(tmp_path: Path) -> None:
    binary = tmp_path / "bin" / "cifar-10-batches-bin"
    python = tmp_path / "py" / "cifar-10-batches-py"
    binary.mkdir(parents=True)
    python.mkdir(parents=True)
    for i, name in enumerate([*(f"data_batch_{k}" for k in range(1, 6)), "test_batch"]):
        records = _cifar_records(20, i)
        records.tofile(binary / f"{name}.bin")
        batch = {b"data": records[:, 1:].copy(), b"labels": records[:, 0].tolist()}
        (python / name).write_bytes(pickle.dumps(batch))
    a = DataConfig(name="cifar10", root=str(tmp_path / "bin")).load()
    b = DataConfig(name="cifar10", root=str(tmp_path / "py")).load()
    assert a.input_shape == b.input_shape == (3, 32, 32) and a.num_classes == 10
    assert len(a.test) == 20 and a.sizes == b.sizes
    assert np.allclose(a.test.tensors[0].numpy(), b.test.tensors[0].numpy())


def test_cifar10_python_batches_are_never_unpickled_freely(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()

    class Evil:
        def __reduce__(self) -> tuple:
            return (print, ("pwned",))

    (folder / "data_batch_1").write_bytes(pickle.dumps({b"data": Evil(), b"labels": [0]}))
    with pytest.raises(DataError, match="not a CIFAR-10 batch.*builtins.print is not allowed"):
        DataConfig(name="cifar10", root=str(tmp_path)).load()


def make_task(*, seed: int, classes: int = 3) -> TaskData:
    """A factory as a user writes one (used through ``factory = "module:function"``)."""
    import torch
    from torch.utils.data import TensorDataset

    x, y = _arrays(30, (1, 8, 8), classes, seed)
    ds = TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    return TaskData(ds, ds, ds, input_shape=(1, 8, 8), num_classes=classes, name="mine")


def _not_a_task(*, seed: int) -> tuple:
    return _arrays(10, (1, 8, 8), 2, seed)


def test_factory(tmp_path: Path) -> None:
    spec = f"{__name__}:make_task"
    task = DataConfig(factory=spec, factory_kwargs={"classes": 4}).load()
    assert task.name == "mine" and task.num_classes == 4
    with pytest.raises(DataError, match="cannot be imported"):
        DataConfig(factory="no_such_module:f").load()
    with pytest.raises(DataError, match="must return an optuna_hpcnas.data.TaskData"):
        DataConfig(factory=f"{__name__}:_not_a_task").load()


def test_the_supernet_takes_shape_and_classes_from_the_data(tmp_path: Path) -> None:
    from optuna_hpcnas.run import build_objective

    path = tmp_path / "d.npz"
    x, y = _arrays(90, (1, 6, 6), 4)
    np.savez(path, x_train=x, y_train=y)
    config = config_from_dict(
        {"study": {"n_trials": 1}, "data": {"name": "npz", "path": str(path)}}
    )
    objective = build_objective(config, config.space.build(), config.data.load(), "cpu")
    assert objective.supernet.input_shape == (1, 6, 6)
    assert objective.supernet.subnet(next(iter(config.space.build().enumerate())))(
        objective.data.train.tensors[0][:2]
    ).shape == (2, 4)
    with pytest.raises(ConfigError, match="needs `root`"):
        config_from_dict({"study": {"n_trials": 1}, "data": {"name": "cifar10"}})
