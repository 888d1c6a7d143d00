from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from qubo import OneHotEncoding


def test_encode_decode() -> None:
    enc = OneHotEncoding(["a", "b"], [["x", "y", "z"], [1, 2]])
    bits = enc.encode(["z", 1])
    assert bits.tolist() == [0, 0, 1, 1, 0]
    assert enc.decode(bits) == ["z", 1]
    assert enc.bit(1, 2) == 4


def test_infeasible_bits() -> None:
    enc = OneHotEncoding(["a"], [["x", "y"]])
    assert not enc.is_feasible(np.array([1, 1]))
    with pytest.raises(ValueError, match="'a' must have exactly one bit set, but has 2"):
        enc.decode([1, 1])
    with pytest.raises(ValueError, match="'q' is not a value of group 'a'"):
        enc.encode(["q"])


def test_bad_groups() -> None:
    with pytest.raises(ValueError, match="'a' has no values"):
        OneHotEncoding(["a"], [[]])
    with pytest.raises(ValueError, match="unique"):
        OneHotEncoding(["a", "a"], [[1], [2]])


def test_qubo_never_imports_optuna_or_torch() -> None:
    code = "import sys, qubo; print(','.join(m for m in ('optuna', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
