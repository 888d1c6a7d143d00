"""``hpcnas run`` on images of any shape and size: it completes, or says why in one line
(exit 2); the signals and the MPI launch are in ``test_any_shape.py``."""

from __future__ import annotations

from typing import Any

from hypothesis import example
from hypothesis import given
from hypothesis import HealthCheck
from hypothesis import settings

from tests.cli_tests.test_any_shape import check_any_shape
from tests.cli_tests.test_any_shape import data_sets


@settings(
    max_examples=7,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=data_sets(image=True))
@example(case={"shape": (3, 48, 48), "n": 200, "classes": 2, "decay": 0.3, "batch": 2})
def test_any_image_shape_completes_or_is_one_line(case: dict[str, Any]) -> None:
    check_any_shape(case)
