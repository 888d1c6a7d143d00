from __future__ import annotations

import pytest

from optuna_hpcnas.distributed import assign_groups
from optuna_hpcnas.distributed import DynamicScheduler
from optuna_hpcnas.distributed import Placement
from optuna_hpcnas.distributed import Task
from optuna_hpcnas.distributed import UtilisationTracker


def test_groups_stay_inside_nodes_and_leftovers_form_a_smaller_group() -> None:
    # two nodes of 3 ranks, interleaved rank numbering (as a round-robin launcher places them)
    placements = [Placement(r, r % 2, r // 2) for r in range(6)]
    groups = assign_groups(placements, 2)
    by_group: dict[int, list[int]] = {}
    for rank, g in enumerate(groups):
        by_group.setdefault(g, []).append(rank)
    assert all(len({r % 2 for r in members}) == 1 for members in by_group.values())
    assert sorted(len(m) for m in by_group.values()) == [1, 1, 2, 2]
    # groups larger than a node take whole nodes in order
    assert assign_groups(placements, 6) == [0] * 6
    assert assign_groups([Placement(r, r // 2, r % 2) for r in range(4)], 4) == [0] * 4
    with pytest.raises(ValueError, match="`group_size` is 0"):
        assign_groups(placements, 0)


def test_dynamic_scheduler_pulls_from_its_source_and_cost_aware_picks_the_largest() -> None:
    pending = [Task(key=i, cost=c) for i, c in enumerate([1.0, 5.0, 3.0, 4.0])]
    scheduler = DynamicScheduler(num_groups=1, source=lambda: pending.pop(0) if pending else None)
    assert [scheduler.next_task(0, 0.0).key for _ in range(4)] == [0, 1, 2, 3]  # type: ignore[union-attr]
    assert scheduler.next_task(0, 0.0) is None
    pending = [Task(key=i, cost=c) for i, c in enumerate([1.0, 5.0, 3.0, 4.0])]
    aware = DynamicScheduler(
        num_groups=1,
        source=lambda: pending.pop(0) if pending else None,
        cost_aware=True,
        lookahead=3,
    )
    # window of 3: {1, 5, 3} -> 5; refill 4 -> {1, 3, 4} -> 4; then 3, then 1
    assert [aware.next_task(0, 0.0).key for _ in range(4)] == [1, 3, 2, 0]  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="`group` is 2"):
        aware.next_task(2, 0.0)
    with pytest.raises(ValueError, match="`lookahead` is 0"):
        DynamicScheduler(num_groups=1, lookahead=0)
    with pytest.raises(ValueError, match="`num_groups` is 0"):
        DynamicScheduler(num_groups=0)


def test_utilisation_tracker_on_a_given_clock() -> None:
    now = [0.0]
    tracker = UtilisationTracker(clock=lambda: now[0])
    with tracker.track("compute"):
        now[0] = 3.0
        with tracker.track("storage"):  # nested: its own time is storage
            now[0] = 4.0
        now[0] = 4.5  # compute again
    with tracker.track("idle"):
        now[0] = 5.0
    now[0] = 8.0
    report = tracker.report(rank=0)
    assert report.shares["compute"] == pytest.approx(3.5 / 8)
    assert report.shares["storage"] == pytest.approx(1 / 8)
    assert report.shares["idle"] == pytest.approx(0.5 / 8)
    assert report.shares["other"] == pytest.approx(3 / 8)
    assert sum(report.shares.values()) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="`category` is 'gpu'"):
        with tracker.track("gpu"):
            pass
