"""CheckpointPolicy: supernet every N steps, top-k architectures every P finished trials."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import optuna
import pytest

from optuna_hpcnas import _keys
from optuna_hpcnas.checkpoints import CheckpointConfig
from optuna_hpcnas.checkpoints import CheckpointPolicy
from optuna_hpcnas.checkpoints import RDBArtifactStore


def test_import_does_not_load_heavy_dependencies() -> None:
    code = (
        "import sys, optuna_hpcnas, optuna_hpcnas.checkpoints;"
        "print([m for m in ('pyarrow', 'torch', 'sqlalchemy') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("direction", ["maximize", "minimize"])
def test_top_k_full_state_every_p_trials_metadata_for_the_rest(
    sqlite_url: str, direction: str
) -> None:
    study = optuna.create_study(storage=sqlite_url, direction=direction)
    store = RDBArtifactStore(sqlite_url)
    calls: list[int] = []

    def arch_state(trial: optuna.trial.FrozenTrial) -> dict[str, np.ndarray]:
        calls.append(trial.number)
        return {"w": np.full(4, trial.params["x"], dtype=np.float32)}

    config = CheckpointConfig(every_p_trials=4, top_k=3, every_n_steps=5)
    policy = CheckpointPolicy(
        study=study, artifact_store=store, architecture_state=arch_state, config=config
    )
    values = [5.0, 1.0, 9.0, 3.0, 8.0, 7.0, 2.0, 6.0]
    for i, v in enumerate(values):
        study.enqueue_trial({"x": float(i)})

        def objective(trial: optuna.Trial, v: float = v) -> float:
            trial.suggest_float("x", 0, 10)
            return v

        study.optimize(objective, n_trials=1, callbacks=[policy])
        info = policy.on_step(i, lambda: ({"s": np.zeros(2)}, {}))
        assert (info is not None) == (i % 5 == 0)

    def best(n_trials: int) -> list[int]:
        order = sorted(range(n_trials), key=lambda i: values[i])
        return (order[::-1] if direction == "maximize" else order)[:3]

    top_after_4, top_after_8 = sorted(best(4)), best(8)
    attrs = study._storage.get_study_system_attrs(study._study_id)
    gen1 = json.loads(attrs[f"{_keys.CHECKPOINT_GENERATION_PREFIX}000001"])
    gen2 = json.loads(attrs[f"{_keys.CHECKPOINT_GENERATION_PREFIX}000002"])
    assert sorted(gen1["top"]) == top_after_4
    assert gen2["top"] == top_after_8
    assert sorted(gen2["others"]) == sorted(set(range(8)) - set(top_after_8))
    # Full states exist exactly for the current top-k; those that fell out were removed.
    for n in range(8):
        infos = policy.architecture_manager(n).list_checkpoints()
        assert bool(infos) == (n in top_after_8), n
        if infos:
            ckpt = policy.architecture_manager(n).load(infos[-1].checkpoint_id)
            assert np.array_equal(ckpt.array("w"), np.full(4, float(n), np.float32))
            assert ckpt.metadata["trial"] == n and ckpt.metadata["values"] == [values[n]]
    # A state is captured once per architecture, not again each generation.
    assert sorted(calls) == sorted(set(calls))
    assert len(policy.supernet.list_checkpoints()) == 2  # steps 0 and 5
