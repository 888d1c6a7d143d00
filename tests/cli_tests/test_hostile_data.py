"""``hpcnas run`` on data files that cannot be used, or that attack the reader: one line,
exit 2, nothing executed, and no database left behind."""

from __future__ import annotations

import io
from pathlib import Path
import pickle
import struct
import zipfile
import zlib

import numpy as np
import pytest

from optuna_hpcnas.cli import main
from tests.run_configs import tiny_config
from tests.run_configs import write_config


def _npy(header: dict, body: bytes) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, header)
    return out.getvalue() + body


def _png_claiming(side: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    ihdr = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


class _RunsCode:
    """A pickle that calls ``os.system`` when loaded."""

    def __init__(self, mark: Path) -> None:
        self.mark = mark

    def __reduce__(self) -> tuple:
        import os

        return (os.system, (f"touch {self.mark}",))


def _hostile(kind: str, tmp: Path) -> dict:
    if kind == "missing npz":
        return {"name": "npz", "path": str(tmp / "none.npz")}
    if kind == "object arrays":
        path = tmp / "objects.npz"
        np.savez(path, x_train=np.array([{"a": 1}, None], dtype=object), y_train=np.arange(2))
        return {"name": "npz", "path": str(path)}
    if kind == "a 7.28 TiB header":
        path = tmp / "huge.npz"
        with zipfile.ZipFile(path, "w") as archive:
            claim = {"descr": "<f8", "fortran_order": False, "shape": (10**12,)}
            archive.writestr("x_train.npy", _npy(claim, bytes(64)))
            labels = {"descr": "<i8", "fortran_order": False, "shape": (8,)}
            archive.writestr("y_train.npy", _npy(labels, bytes(64)))
        return {"name": "npz", "path": str(path)}
    if kind == "a decompression bomb":
        root = tmp / "images"
        for name in ("a", "b"):
            (root / "train" / name).mkdir(parents=True)
        (root / "train" / "a" / "bomb.png").write_bytes(_png_claiming(30_000))
        return {"name": "image_folder", "root": str(root)}
    assert kind == "a CIFAR batch that runs code"
    root = tmp / "cifar"
    root.mkdir()
    payload = {b"data": _RunsCode(tmp / "pwned"), b"labels": [0]}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        (root / name).write_bytes(pickle.dumps(payload))
    return {"name": "cifar10", "root": str(root)}


@pytest.mark.parametrize(
    "kind",
    [
        "missing npz",
        "object arrays",
        "a 7.28 TiB header",
        "a decompression bomb",
        "a CIFAR batch that runs code",
    ],
)
def test_unusable_data_is_one_line_and_leaves_no_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    data = _hostile(kind, tmp_path)
    config = write_config(
        tmp_path / "nas.toml",
        tiny_config(
            study={"name": "hostile", "storage": f"sqlite:///{tmp_path / 'nas.db'}"}, data=data
        ),
    )
    assert main(["-q", "run", "--config", str(config), "--no-progress"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpcnas run: error: [data] "), err
    assert "Traceback" not in err
    assert not list(tmp_path.glob("nas.db*")), "a database was created"
    assert not (tmp_path / "pwned").exists(), "the pickle ran code"
