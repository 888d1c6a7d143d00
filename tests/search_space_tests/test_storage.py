"""The space definition travels through real RDB storages between processes."""

from __future__ import annotations

import subprocess
import sys

import optuna
import pytest

from optuna_hpcnas import HierarchicalSearchSpace

pytestmark = pytest.mark.services

CHILD = """
import sys, optuna
from optuna_hpcnas import HierarchicalSearchSpace
study = optuna.load_study(study_name="s", storage=sys.argv[1])
space = HierarchicalSearchSpace.from_study(study)
trial = study.ask()
arch = space.suggest(trial)
study.tell(trial, 1.0)
print(space.cardinality(), arch.num_cells)
"""


@pytest.mark.parametrize("url_fixture", ["postgres_url", "mysql_url"])
def test_definition_shared_across_processes(
    url_fixture: str, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue(url_fixture)
    space = HierarchicalSearchSpace.preset("sequence")
    study = optuna.create_study(study_name="s", storage=url)
    space.suggest(study.ask())
    out = subprocess.run(
        [sys.executable, "-c", CHILD, url], capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == [str(space.cardinality()), "4"]
    assert len(study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))) == 1


def test_one_space_records_itself_in_every_new_in_memory_study() -> None:
    # In-memory studies all have study id 0, and a freed storage's id() comes back: a cache
    # keyed by (id(storage), study_id) skipped the record and hid the space from samplers.
    import gc

    from optuna_hpcnas import HierarchicalSearchSpace

    space = HierarchicalSearchSpace.preset("digits-small")
    for _ in range(20):
        study = optuna.create_study()
        space.suggest(study.ask())
        assert HierarchicalSearchSpace.from_study(study) == space
        del study
        gc.collect()
