"""Evaluation groups, DeepSpeed engines and the search loop under a real ``mpirun``.

Every test launches ``mpirun -n N python -m mpi4py ...`` (oversubscribed on 2 cores); several
checks share one launch because each rank pays torch and DeepSpeed imports. DeepSpeed's
shared-memory op is skipped (``[distributed] shm_op = "skip"``, the default), so no test
compiles anything.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
import subprocess
import sys

import optuna
import pytest
import sqlalchemy

from optuna_hpcnas import _keys
from tests.mpi_helpers import run_mpi
from tests.run_configs import tiny_config
from tests.run_configs import write_config

pytestmark = pytest.mark.mpi
SCRIPTS = Path(__file__).parent / "scripts"
REPO = Path(__file__).resolve().parents[2]


def _hpcnas_run(
    n: int, config: Path, *, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``mpirun -n n python -m mpi4py -m optuna_hpcnas run --config config``; it must exit 0."""
    args = ["-m", "optuna_hpcnas", "run", "--config", str(config), "--no-progress"]
    proc = run_mpi(n, args, timeout=timeout, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _result(stdout: str) -> list[dict]:
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, stdout
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.mark.parametrize("n", [2, 4])
def test_group_formation_and_leader_protocol(n: int) -> None:
    proc = run_mpi(n, [str(SCRIPTS / "groups_check.py")], timeout=90, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    ranks = _result(proc.stdout)
    assert len(ranks) == n
    for size in (1, 2, 4):
        effective = min(size, n)
        records = [r[str(size)] for r in ranks]
        # consecutive ranks of one node form each group; rank 0 of each group leads
        assert [r["index"] for r in records] == [w // effective for w in range(n)]
        assert all(r["num_groups"] == n // effective for r in records)
        assert [r["group_rank"] for r in records] == [w % effective for w in range(n)]
        assert all(r["sizes"] == [effective] * (n // effective) for r in records)
        assert all(r["single_node"] and r["node"] == 0 for r in records)
        assert [r["local_rank"] for r in records] == list(range(n))
        for w, r in enumerate(records):
            leader = w % effective == 0
            assert r["leader"] is leader
            assert r["leaders"] == (n // effective if leader else None)
            # one node: every leader is in the node-level communicator, one in the cross-node one
            assert r["node_leaders"] == (n // effective if leader else None)
            assert r["cross_node"] == (1 if w == 0 else None)
            assert r["shared"] == {"group": r["index"], "from": w - w % effective}
            # the leader's error reaches every rank of its group, and only that group
            if leader:
                assert r["error"] == f"ValueError: boom in group {r['index']}"
            else:
                assert r["error"].startswith("GroupError: The leader of evaluation group")
                assert f"boom in group {r['index']}" in r["error"]
            assert r["after"] == "still alive"


def test_pipeline_2_by_data_2_trains_and_replicas_stay_equal() -> None:
    proc = run_mpi(4, [str(SCRIPTS / "engine_check.py")], timeout=150, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = sorted(_result(proc.stdout), key=lambda r: r["rank"])
    pipes = [r["pipeline"] for r in ranks]
    assert all(p["kind"] == "pipeline" for p in pipes)
    # topology: rank = stage * dp + replica
    assert [(p["stage"], p["replica"]) for p in pipes] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # each stage holds its own layers; the two data-parallel replicas of a stage are equal
    assert set(pipes[0]["local"]) == set(pipes[1]["local"]) == {"0", "1", "2"}
    assert set(pipes[2]["local"]) == set(pipes[3]["local"]) == {"3", "4"}
    assert pipes[0]["local"] == pipes[1]["local"]
    assert pipes[2]["local"] == pipes[3]["local"]
    # it trains: the loss goes down and the weighted layers moved
    losses = pipes[0]["losses"]
    assert sum(losses[-3:]) < sum(losses[:3])
    assert pipes[0]["changed"] == [True, False, True, False, True]
    # after copy-back and broadcast from the stage owners every rank holds the trained net
    assert all(p["after_sync"] == pipes[0]["after_sync"] for p in pipes)
    # the world was re-formed with 2 ranks for a ZeRO-3 data-parallel engine
    assert "zero3" not in ranks[2] and "zero3" not in ranks[3]
    z3 = ranks[0]["zero3"]
    assert z3["kind"] == "data"
    assert sum(z3["losses"][-3:]) < sum(z3["losses"][:3])
    assert z3["changed"] == [True, False, True, False, True]
    # averaging between 4 groups: mean of the changes, local progress in flight kept
    for compression in ("none", "powersgd"):
        for r in ranks:
            got = r[compression]
            assert got["rounds"] == 1 and got["bytes"] > 0
            extra = 10.0 if r["rank"] == 1 else 0.0
            assert got["matrix"] == pytest.approx([1.5 + extra] * 48, abs=1e-4)
            assert got["vector"] == pytest.approx([3.0] * 5, abs=1e-5)
    # rank-2 factors of an 8x6 matrix plus the dense vector: fewer bytes than the raw delta
    assert ranks[3]["powersgd"]["bytes"] < ranks[3]["none"]["bytes"]


def test_exception_on_one_rank_ends_every_rank(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "nas.toml",
        tiny_config(
            study={
                "name": "abort",
                "storage": f"sqlite:///{tmp_path / 'abort.db'}",
                "n_trials": 2,
            },
            space={"overrides": {"data_parallel": [2]}},
            pruner={"name": "none"},
            distributed={"group_size": 2, "collective_timeout_s": 600},
        ),
    )
    # rank 0 waits in a gloo all-reduce for rank 1, which raised: without the abort it would
    # sit there for the 600 s collective timeout, past this test's subprocess timeout
    proc = run_mpi(2, [str(SCRIPTS / "abort_check.py"), str(config)], timeout=90, cwd=REPO)
    assert proc.returncode != 0
    assert "injected failure on rank 1" in proc.stderr
    assert "NOT REACHED" not in proc.stdout


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.services)]
)
def test_four_rank_search_two_groups_one_study(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'nas.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    n_trials = 10
    # the URL travels in OPTUNA_STORAGE, as a password would (not on the command line)
    config = write_config(
        tmp_path / "nas.toml",
        tiny_config(
            study={"name": "mpi-search", "n_trials": n_trials},
            space={"overrides": {"data_parallel": [1, 2], "pipeline_stages": [1, 2]}},
            sampler={"name": "random", "seed": 3},
            pruner={"name": "none"},
            objective={"population_steps": 2},
            distributed={"group_size": 2, "sync_interval": 1},
        ),
    )
    _hpcnas_run(4, config, timeout=180, env={"OPTUNA_STORAGE": url})
    study = optuna.load_study(study_name="mpi-search", storage=url)
    trials = study.get_trials(deepcopy=False)
    # exactly the budget: none lost, none extra, each number once, all finished
    assert sorted(t.number for t in trials) == list(range(n_trials))
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    engine = sqlalchemy.create_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(sqlalchemy.text("SELECT trial_id, number FROM trials")).all()
    engine.dispose()
    assert len(rows) == len({r[0] for r in rows}) == len({r[1] for r in rows}) == n_trials
    # groups of 2 ranks: the run's space offers only layouts that fit (dp 1 or 2, pp 1), so
    # no trial is spent on one that cannot run
    assert {t.params["cluster.data_parallel"] for t in trials} == {1, 2}
    assert all("cluster.pipeline_stages" not in t.params for t in trials)
    assert not any(_keys.DISTRIBUTED_INFEASIBLE in t.system_attrs for t in trials)
    assert {t.system_attrs[_keys.DISTRIBUTED_GROUP] for t in trials} == {0, 1}
    for t in trials:
        assert 0.0 <= t.values[0] <= 1.0
        dp = t.params["cluster.data_parallel"]
        engine = "plain" if dp == 1 else "deepspeed"
        assert t.system_attrs[_keys.DISTRIBUTED_LAYOUT] == f"dp{dp}xpp1 on 2 ranks ({engine})"
        # the evaluation's own time: a trial asked ahead is RUNNING while the one before trains
        seconds = t.system_attrs[_keys.DISTRIBUTED_EVALUATION_SECONDS]
        assert 0 < seconds <= (t.datetime_complete - t.datetime_start).total_seconds()
    # utilisation of every rank stored in the study; averaging moved bytes between groups
    attrs = study._storage.get_study_system_attrs(study._study_id)
    runs = json.loads(attrs[_keys.DISTRIBUTED_UTILISATION])
    assert len(runs) == 1
    ranks = runs[0]["ranks"]
    assert sorted(r["rank"] for r in ranks) == [0, 1, 2, 3]
    for r in ranks:
        assert sum(r["shares"].values()) == pytest.approx(1.0, abs=1e-6)
        assert r["shares"]["compute"] > 0
        # the search loop's own shares: the drain at the end is outside it
        loop = r["loop_shares"]
        assert sum(loop.values()) == pytest.approx(1.0, abs=1e-6)
        assert loop["compute"] > 0 and loop["drain"] == 0.0 and loop["setup"] == 0.0
        assert 0 < r["loop_seconds"] < r["wall_seconds"]
        # two groups: each leader asked ahead and told on its storage thread
        if r["leader"]:
            assert r["storage_thread"]["storage"] > 0 and r["storage_thread"]["sampler"] > 0
        else:
            assert r["storage_thread"] == {}
    assert attrs[_keys.DISTRIBUTED_SYNC_BYTES] > 0
    assert sum(r["trials"] for r in ranks) == len(trials)
    # `hpcnas status` prints these same per-rank loop shares
    status = subprocess.run(
        [sys.executable, "-m", "optuna_hpcnas", "status", "--study-name", "mpi-search"],
        capture_output=True,
        text=True,
        env={**os.environ, "OPTUNA_STORAGE": url},
        timeout=120,
        check=True,
    )
    expected = "  ".join(
        f"rank {r['rank']}: {100 * r['loop_shares']['compute']:.1f}%"
        for r in sorted(ranks, key=lambda r: r["rank"])
    )
    assert f"compute      {expected}" in status.stdout


def test_the_timeout_stops_a_group_of_two_ranks_at_the_same_validation(tmp_path: Path) -> None:
    """Past the timeout the group's leader says "stop" at a validation and its other rank
    stops with it: the trial is pruned there and the run ends cleanly, nothing left RUNNING."""
    from optuna_hpcnas.config import config_from_dict
    from optuna_hpcnas.run import run_search

    url = f"sqlite:///{tmp_path / 'nas.db'}"
    stages = [
        {"name": "quick", "steps": 40, "lr": 1e-3},
        {"name": "full", "steps": 40, "lr": 1e-2},
    ]
    sections = {
        "study": {"name": "timed", "storage": url, "n_trials": 1},
        "pruner": {"name": "none"},
        "stages": {"stages": stages, "eval_every": 10},
    }
    run_search(config_from_dict(tiny_config(**sections)))  # the study holds a complete trial
    sections["study"] = {"name": "timed", "n_trials": 1, "timeout": 0.05}
    sections["distributed"] = {"group_size": 2}
    config = write_config(tmp_path / "nas.toml", tiny_config(**sections))
    _hpcnas_run(2, config, timeout=120, env={"OPTUNA_STORAGE": url})
    first, second = optuna.load_study(study_name="timed", storage=url).trials
    assert first.state == optuna.trial.TrialState.COMPLETE
    assert second.state == optuna.trial.TrialState.PRUNED
    assert second.user_attrs[_keys.OBJECTIVE_SEARCH_ENDED] in (10, 20, 30, 40, 50, 60, 70)
    assert "on 2 ranks" in second.system_attrs[_keys.DISTRIBUTED_LAYOUT]


@pytest.mark.parametrize("batch", [1, 3])
def test_one_shot_mode_under_mpirun_two_groups(tmp_path: Path, batch: int) -> None:
    """Two groups score the budget by inherited weights (one by one, or in batches on each
    leader's copy of the study); its last two trials are finalists (each the architecture of
    an inherited trial, trained through the stages), taken by whichever group pops them."""
    url = f"sqlite:///{tmp_path / 'nas.db'}"
    config = write_config(
        tmp_path / "nas.toml",
        tiny_config(
            study={"name": "one-shot", "n_trials": 10, "storage": url},
            space={"preset": "digits-elastic"},
            training={"sandwich": True, "paths_per_batch": 3},
            objective={"mode": "one-shot", "finalists": 2},
            distributed={"group_size": 1, "one_shot_batch": batch},
        ),
    )
    _hpcnas_run(2, config, timeout=180)
    study = optuna.load_study(study_name="one-shot", storage=url)
    trials = study.get_trials(deepcopy=False)
    assert len(trials) == 10 and all(t.state.is_finished() for t in trials)
    finalists = [t for t in trials if _keys.OBJECTIVE_FINALIST_OF in t.user_attrs]
    assert len(finalists) == 2
    by_number = {t.number: t for t in trials}
    for t in finalists:
        assert t.user_attrs[_keys.OBJECTIVE_FIDELITY] == "trained"
        assert t.user_attrs[_keys.OBJECTIVE_STEPS] > 0
        source = by_number[t.user_attrs[_keys.OBJECTIVE_FINALIST_OF]]
        assert source.user_attrs[_keys.OBJECTIVE_FIDELITY] == "inherited"
        assert source.params == t.params
    inherited = [t for t in trials if t not in finalists]
    assert all(t.user_attrs[_keys.OBJECTIVE_FIDELITY] == "inherited" for t in inherited)
    if batch > 1:  # both leaders wrote batches (each of its own copy)
        sources = {t.system_attrs.get(_keys.RUN_BATCH_SOURCE) for t in inherited}
        assert len(sources - {None}) == 2, sources
