"""Several processes writing checkpoint chains into one study at the same time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import optuna
import pytest

from optuna_hpcnas.checkpoints import CheckpointManager
from optuna_hpcnas.checkpoints import RDBArtifactStore

from ._util import finish
from ._util import spawn
from ._worker import expected_state

N_WORKERS = 4
STEPS = 5


@pytest.mark.slow
def test_four_concurrent_writers_every_checkpoint_readable(db_url: str, tmp_path: Path) -> None:
    optuna.create_study(study_name="concurrent", storage=db_url)
    go = tmp_path / "go"
    procs = [
        spawn(
            "concurrent_writer",
            "--url",
            db_url,
            "--marker",
            str(go),
            "--worker",
            str(w),
            "--steps",
            str(STEPS),
        )  # fmt: skip
        for w in range(N_WORKERS)
    ]
    go.write_text("go")
    for p in procs:
        rc, out = finish(p)
        assert rc == 0, out

    study = optuna.load_study(study_name="concurrent", storage=db_url)
    store = RDBArtifactStore(db_url)
    for w in range(N_WORKERS):
        manager = CheckpointManager(study=study, artifact_store=store, namespace=f"worker-{w}")
        infos = manager.list_checkpoints()
        assert [i.step for i in infos] == list(range(1, STEPS + 1))
        assert [i.kind for i in infos] == ["full", "incremental", "incremental"] + [
            "full",
            "incremental",
        ]
        for info in infos:
            state = manager.load(info.checkpoint_id).state()
            expected = expected_state(w, info.step)
            assert set(state) == set(expected)
            for k, v in expected.items():
                assert np.array_equal(state[k], v), (w, info.step, k)
    store.dispose()
