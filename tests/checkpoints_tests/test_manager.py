"""CheckpointManager: increments, chains, fallback to the newest valid checkpoint, retention."""

from __future__ import annotations

import json
from pathlib import Path
import signal
import warnings

import numpy as np
import optuna
from optuna.artifacts import FileSystemArtifactStore
import pytest
import sqlalchemy
import torch

from optuna_hpcnas.checkpoints import CheckpointConfig
from optuna_hpcnas.checkpoints import CheckpointError
from optuna_hpcnas.checkpoints import CheckpointManager
from optuna_hpcnas.checkpoints import InvalidCheckpointWarning
from optuna_hpcnas.checkpoints import RDBArtifactStore
from optuna_hpcnas.checkpoints import restore_training_state
from optuna_hpcnas.checkpoints import training_state
from optuna_hpcnas.checkpoints._format import read_records

from ._util import finish
from ._util import spawn
from ._util import wait_for


def _setup(url: str, **config: int) -> tuple[optuna.Study, RDBArtifactStore, CheckpointManager]:
    study = optuna.create_study(storage=url)
    store = RDBArtifactStore(url)
    cfg = CheckpointConfig(**{"keep_chains": 100, **config})
    return study, store, CheckpointManager(study=study, artifact_store=store, config=cfg)


def _states(n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Step k changes tensor ``a`` always, ``b`` every other step, never ``c``."""
    rng = np.random.default_rng(seed)
    state = {
        "a": rng.standard_normal(1000).astype(np.float32),
        "b": rng.standard_normal((10, 10)),
        "c": np.arange(50, dtype=np.int64),
    }
    out = []
    for k in range(n):
        state = dict(state)
        state["a"] = state["a"] - 0.01 * rng.standard_normal(1000).astype(np.float32)
        if k % 2:
            state["b"] = state["b"] * 0.9
        out.append(state)
    return out


def _assert_state(ckpt_state: dict, expected: dict) -> None:
    assert set(ckpt_state) == set(expected)
    for k, v in expected.items():
        assert ckpt_state[k].tobytes() == v.tobytes(), k


def test_increments_store_only_changes_and_every_checkpoint_replays(sqlite_url: str) -> None:
    study, store, manager = _setup(sqlite_url, full_every=4)
    states = _states(9)
    infos = [manager.save(s, step=i, metadata={"i": i}) for i, s in enumerate(states)]
    assert [i.kind for i in infos] == ["full", "incremental", "incremental", "incremental"] * 2 + [
        "full"
    ]
    assert [i.depth for i in infos] == [0, 1, 2, 3, 0, 1, 2, 3, 0]
    assert [i.n_changed for i in infos[1:4]] == [2, 1, 2]  # "a" always, "b" on odd k
    # The unchanged tensor is a reference without payload.
    blob = store.open_reader(infos[2].artifact_id).read()
    records = {r.name: r for r in read_records(blob)[1]}
    assert records["c"].encoding == "ref" and records["c"].payload == b""
    assert records["a"].encoding == "xor" and records["a"].parent == infos[1].checkpoint_id
    assert infos[1].size < infos[0].size
    reader = CheckpointManager(study=study, artifact_store=store)
    for info, state in zip(infos, states):
        ckpt = reader.load(info.checkpoint_id)
        _assert_state(ckpt.state(), state)
        assert ckpt.metadata == {"i": info.step}


def test_works_with_filesystem_artifact_store(tmp_path: Path) -> None:
    study = optuna.create_study()
    store = FileSystemArtifactStore(str(tmp_path))
    manager = CheckpointManager(study=study, artifact_store=store)
    states = _states(3)
    for i, s in enumerate(states):
        manager.save(s, step=i)
    _assert_state(
        CheckpointManager(study=study, artifact_store=store).load_latest().state(), states[-1]
    )


def _corrupt_chunk(store: RDBArtifactStore, artifact_id: str, how: str) -> None:
    with store.engine.begin() as conn:
        data = conn.execute(
            sqlalchemy.text(
                "SELECT data FROM hpcnas_artifact_chunks WHERE artifact_id=:a AND idx=0"
            ),
            {"a": artifact_id},
        ).scalar_one()
        data = bytearray(data)
        if how == "flip":
            data[len(data) // 2] ^= 0x40
        else:
            data = data[: len(data) // 2]
        conn.execute(
            sqlalchemy.text(
                "UPDATE hpcnas_artifact_chunks SET data=:d WHERE artifact_id=:a AND idx=0"
            ),
            {"d": bytes(data), "a": artifact_id},
        )


@pytest.mark.parametrize("how", ["flip", "truncate"])
def test_damaged_newest_falls_back_with_warning_naming_it(sqlite_url: str, how: str) -> None:
    study, store, manager = _setup(sqlite_url, full_every=10)
    states = _states(3)
    infos = [manager.save(s, step=i) for i, s in enumerate(states)]
    _corrupt_chunk(store, infos[2].artifact_id, how)
    fresh = CheckpointManager(study=study, artifact_store=store)
    with pytest.warns(InvalidCheckpointWarning, match=infos[2].checkpoint_id) as record:
        ckpt = fresh.load_latest()
    assert len(record) == 1
    assert ckpt is not None and ckpt.info.checkpoint_id == infos[1].checkpoint_id
    _assert_state(ckpt.state(), states[1])
    with pytest.raises(CheckpointError, match="checksum|corrupted"):
        fresh.load(infos[2].checkpoint_id)
    # The next save continues the chain from the good checkpoint.
    nxt = fresh.save(states[2], step=3)
    assert nxt.parent_id == infos[1].checkpoint_id
    _assert_state(
        CheckpointManager(study=study, artifact_store=store).load_latest().state(), states[2]
    )


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda m: {**m, "step": str(m["step"])}, id="step-string"),
        pytest.param(lambda m: {**m, "step": True}, id="step-bool"),
        pytest.param(lambda m: {**m, "size": None}, id="size-null"),
        pytest.param(lambda m: {**m, "created_at": "yesterday"}, id="created-at-string"),
        pytest.param(lambda m: {**m, "metadata": [1, 2]}, id="metadata-list"),
        pytest.param(lambda m: {k: v for k, v in m.items() if k != "sha256"}, id="missing"),
        pytest.param(lambda m: [m], id="not-an-object"),
        pytest.param(lambda m: "{not json", id="invalid-json"),
        pytest.param(lambda m: "[" * 100_000 + "]" * 100_000, id="nested-too-deeply"),
        pytest.param(lambda m: {**m, "step": -3}, id="step-negative"),
        pytest.param(lambda m: {**m, "step": 10**30}, id="step-10**30"),
        pytest.param(lambda m: {**m, "size": -1}, id="size-negative"),
    ],
)
def test_damaged_manifest_is_skipped_with_warning_naming_it(sqlite_url: str, damage) -> None:
    """Valid JSON with a wrong-typed field is skipped like invalid JSON (it used to raise a
    TypeError while sorting the manifests)."""
    study, store, manager = _setup(sqlite_url, full_every=10)
    states = _states(3)
    infos = [manager.save(s, step=i) for i, s in enumerate(states)]
    key = f"hpcnas:checkpoints:manifest:supernet:{infos[2].checkpoint_id}"
    attrs = study._storage.get_study_system_attrs(study._study_id)
    damaged = damage(json.loads(attrs[key]))
    study._storage.set_study_system_attr(
        study._study_id, key, damaged if isinstance(damaged, str) else json.dumps(damaged)
    )
    fresh = CheckpointManager(study=study, artifact_store=store)
    with pytest.warns(InvalidCheckpointWarning, match=infos[2].checkpoint_id):
        ckpt = fresh.load_latest()
    assert ckpt is not None and ckpt.info.checkpoint_id == infos[1].checkpoint_id
    _assert_state(ckpt.state(), states[1])
    with pytest.warns(InvalidCheckpointWarning):
        assert [i.checkpoint_id for i in fresh.list_checkpoints()] == [
            i.checkpoint_id for i in infos[:2]
        ]


def test_damage_in_a_chain_invalidates_descendants_only(sqlite_url: str) -> None:
    """A flipped byte in the middle of a chain: its descendants fail, its ancestors load."""
    study, store, manager = _setup(sqlite_url, full_every=10)
    states = _states(5)
    infos = [manager.save(s, step=i) for i, s in enumerate(states)]
    _corrupt_chunk(store, infos[2].artifact_id, "flip")
    fresh = CheckpointManager(study=study, artifact_store=store)
    with pytest.warns(InvalidCheckpointWarning) as record:
        ckpt = fresh.load_latest()
    named = [str(w.message) for w in record]
    assert [infos[k].checkpoint_id in m for k, m in zip((4, 3, 2), named)] == [True] * 3
    assert ckpt is not None and ckpt.step == 1


@pytest.mark.parametrize("missing", ["manifest", "blob"])
def test_missing_middle_link_is_detected(sqlite_url: str, missing: str) -> None:
    study, store, manager = _setup(sqlite_url, full_every=10)
    states = _states(4)
    infos = [manager.save(s, step=i) for i, s in enumerate(states)]
    middle = infos[1]
    if missing == "manifest":
        study._storage.set_study_system_attr(
            study._study_id, manager._prefix + middle.checkpoint_id, json.dumps(None)
        )
    else:
        store.remove(middle.artifact_id)
    fresh = CheckpointManager(study=study, artifact_store=store)
    with pytest.raises(CheckpointError, match=middle.checkpoint_id):
        fresh.load(infos[3].checkpoint_id)
    with pytest.warns(InvalidCheckpointWarning) as record:
        ckpt = fresh.load_latest()
    skipped = [str(w.message) for w in record]
    assert infos[3].checkpoint_id in skipped[0] and middle.checkpoint_id in skipped[0]
    assert ckpt is not None and ckpt.step == 0  # the chain's full checkpoint
    _assert_state(ckpt.state(), states[0])


def test_retention_keeps_newest_chains(sqlite_url: str) -> None:
    study, store, manager = _setup(sqlite_url, full_every=2)
    manager = CheckpointManager(
        study=study, artifact_store=store, config=CheckpointConfig(full_every=2, keep_chains=2)
    )
    infos = [manager.save(s, step=i) for i, s in enumerate(_states(7))]
    # Chains (0,1) (2,3) (4,5) (6): the current one and the previous one stay.
    kept = [i.checkpoint_id for i in manager.list_checkpoints()]
    assert kept == [i.checkpoint_id for i in infos[4:]]
    for gone in infos[:4]:
        assert not store.exists(gone.artifact_id)
    with store.engine.connect() as conn:
        n = conn.execute(sqlalchemy.text("SELECT COUNT(*) FROM hpcnas_artifacts")).scalar()
    assert n == 3
    attrs = study._storage.get_study_system_attrs(study._study_id)
    assert json.loads(attrs[f"artifacts:{infos[0].artifact_id}"]) is None  # gone from dashboard


def test_torch_resume_matches_uninterrupted_training(sqlite_url: str) -> None:
    """Save mid-training, restore into fresh objects: the rest of training is bit-identical."""

    def make() -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.Generator]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)
        )
        return (
            model,
            torch.optim.Adam(model.parameters(), lr=1e-2),
            torch.Generator().manual_seed(3),
        )

    def train(model, opt, gen, steps: int) -> None:  # type: ignore[no-untyped-def]
        for _ in range(steps):
            x = torch.randn(4, 8, generator=gen) + torch.randn(4, 8) * 0.1  # global RNG too
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()

    model, opt, gen = make()
    train(model, opt, gen, 10)
    reference = {k: v.clone() for k, v in model.state_dict().items()}

    study, store, manager = _setup(sqlite_url, full_every=3)
    model, opt, gen = make()
    for step in range(1, 6):
        train(model, opt, gen, 1)
        tensors, meta = training_state(model, opt, generators={"data": gen}, extra={"step": step})
        manager.save(tensors, step=step, metadata=meta)
    torch.manual_seed(1234)  # a fresh process would have another global RNG state

    model, opt, gen = make()
    ckpt = CheckpointManager(study=study, artifact_store=store).load_latest()
    meta = restore_training_state(ckpt, model, opt, generators={"data": gen})
    assert meta["step"] == 5 and ckpt.info.kind == "incremental"
    train(model, opt, gen, 5)
    for k, v in model.state_dict().items():
        assert torch.equal(v, reference[k]), k


@pytest.mark.slow
def test_kill_9_during_checkpoint_write_keeps_previous(db_url: str, tmp_path: Path) -> None:
    """SIGKILL while the second blob is half written: only the first checkpoint exists."""
    marker = tmp_path / "frozen"
    proc = spawn("write_then_freeze", "--url", db_url, "--marker", str(marker))
    try:
        wait_for(marker, proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        finish(proc)
    study = optuna.load_study(study_name="write", storage=db_url)
    store = RDBArtifactStore(db_url)
    manager = CheckpointManager(study=study, artifact_store=store)
    with warnings.catch_warnings():
        warnings.simplefilter("error", InvalidCheckpointWarning)
        ckpt = manager.load_latest()
    assert ckpt is not None and ckpt.step == 1
    assert [i.step for i in manager.list_checkpoints()] == [1]
    # The aborted transaction left no chunk rows behind.
    with store.engine.connect() as conn:
        ids = (
            conn.execute(
                sqlalchemy.text("SELECT DISTINCT artifact_id FROM hpcnas_artifact_chunks")
            )
            .scalars()
            .all()
        )
    assert ids == [ckpt.info.artifact_id]
    store.dispose()


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda meta: {**meta, "supernet_steps": "abc"}, id="steps-abc"),
        pytest.param(lambda meta: {**meta, "supernet_steps": -5}, id="steps-negative"),
        pytest.param(
            lambda meta: {k: v for k, v in meta.items() if k != "optimizer"}, id="no-optimizer"
        ),
        pytest.param(
            lambda meta: {**meta, "optimizer": {"scalars": 3, "param_groups": []}},
            id="optimizer-malformed",
        ),
    ],
)
def test_a_checkpoint_whose_content_does_not_fit_is_skipped_untouched(
    sqlite_url: str, damage
) -> None:
    """What the run's restore does (``run._checkpointing``): the newest checkpoint that can
    be restored wins; one that cannot is skipped with a warning naming it, and the model and
    optimizer are left as they were by the failed attempt."""
    from optuna_hpcnas.run._checkpointing import supernet_steps

    study, store, manager = _setup(sqlite_url, full_every=10)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    saved = []
    for step in (10, 20):
        model(torch.randn(8, 4)).sum().backward()
        optimizer.step()
        tensors, meta = training_state(model, optimizer, extra={"supernet_steps": step})
        saved.append((manager.save(tensors, step=step, metadata=meta), model.weight.clone()))
    newest = saved[-1][0]
    key = f"hpcnas:checkpoints:manifest:supernet:{newest.checkpoint_id}"
    manifest = json.loads(study._storage.get_study_system_attrs(study._study_id)[key])
    manifest["metadata"] = damage(manifest["metadata"])
    study._storage.set_study_system_attr(study._study_id, key, json.dumps(manifest))

    fresh_model = torch.nn.Linear(4, 3)
    before = fresh_model.weight.clone()
    fresh_optimizer = torch.optim.Adam(fresh_model.parameters(), lr=0.1)
    attempts = []

    def apply(checkpoint) -> None:
        attempts.append(checkpoint.info.checkpoint_id)
        steps = supernet_steps(checkpoint)
        restore_training_state(checkpoint, fresh_model, fresh_optimizer)
        assert steps == 10

    fresh = CheckpointManager(study=study, artifact_store=store)
    with pytest.warns(InvalidCheckpointWarning, match=newest.checkpoint_id):
        restored = fresh.load_latest(accept=apply)
    assert attempts == [newest.checkpoint_id, saved[0][0].checkpoint_id]
    assert restored is not None and restored.step == 10
    assert torch.equal(fresh_model.weight, saved[0][1])
    assert not torch.equal(fresh_model.weight, before)
    assert fresh_optimizer.state_dict()["state"]  # Adam's moments came back too


def test_a_tensor_of_another_shape_leaves_the_model_as_it_was(sqlite_url: str) -> None:
    study, store, manager = _setup(sqlite_url)
    tensors, meta = training_state(torch.nn.Linear(4, 3))
    manager.save(tensors, step=1, metadata=meta)
    other = torch.nn.Linear(4, 5)
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(CheckpointError, match="does not fit this model"):
        restore_training_state(manager.load_latest(), other)
    assert all(torch.equal(v, before[k]) for k, v in other.state_dict().items())
