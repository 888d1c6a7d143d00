"""``export_choice``: the best trial, unless a published model is within one standard error."""

from __future__ import annotations

import optuna
from optuna.trial import create_trial
import pytest

from optuna_hpcnas import _keys
from optuna_hpcnas._summary import export_choice


def _study(
    *trials: tuple[float, dict], directions: tuple[str, ...] = ("maximize",)
) -> optuna.Study:
    study = optuna.create_study(directions=list(directions))
    for value, attrs in trials:
        values = [value] * len(directions)
        study.add_trial(create_trial(values=values, user_attrs=attrs))
    return study


def _attrs(accuracy: float, samples: int | None = 50, reference: str | None = None) -> dict:
    attrs: dict = {_keys.OBJECTIVE_ACCURACY: accuracy}
    if samples is not None:
        attrs[_keys.OBJECTIVE_VALIDATION_SAMPLES] = samples
    if reference is not None:
        attrs[_keys.OBJECTIVE_REFERENCE] = reference
    return attrs


def test_a_published_model_within_one_standard_error_is_chosen() -> None:
    # 0.90 on 50 samples: a standard error of 0.042, x sqrt(2 ln 2) for the best of two
    study = _study((0.88, _attrs(0.88, reference="fcn")), (0.90, _attrs(0.90)))
    choice = export_choice(study)
    assert choice is not None
    trial, why = choice
    assert trial.number == 0 and why is not None and "'fcn'" in why and "within 0.050" in why


def test_of_published_models_within_the_margin_the_first_enqueued_is_chosen() -> None:
    """The order of ``[study] enqueue`` decides between published models the validation
    cannot tell apart, whichever scored higher; one beyond the margin is not chosen."""
    study = _study(
        (0.95, _attrs(0.95, 67, reference="fcn")),
        (0.97, _attrs(0.97, 67, reference="cnn")),
        (0.90, _attrs(0.90, 67)),
    )
    choice = export_choice(study)
    assert choice is not None
    trial, why = choice
    assert trial.number == 0 and "'fcn'" in str(why) and "first enqueued" in str(why)
    far = _study(
        (0.80, _attrs(0.80, 67, reference="fcn")),
        (0.97, _attrs(0.97, 67, reference="cnn")),
        (0.90, _attrs(0.90, 67)),
    )
    assert export_choice(far) == (far.trials[1], None)
    mine = _study((0.95, _attrs(0.95, 67, reference="fcn")), (0.96, _attrs(0.96, 67)))
    assert export_choice(mine)[0].number == 0  # type: ignore[index]


def test_the_margin_widens_with_the_number_of_candidates() -> None:
    """The best of many noisy estimates is optimistic: 0.975 vs a best of 1.00 on 50 samples
    is within the margin of the best of 20 (0.02 x 2.45), not of the best of 2 (x 1.18)."""
    few = _study((0.975, _attrs(0.975, reference="fcn")), (1.0, _attrs(1.0)))
    assert export_choice(few)[0].number == 1  # type: ignore[index]
    others = [(0.9, _attrs(0.9)) for _ in range(18)]
    many = _study((0.975, _attrs(0.975, reference="fcn")), (1.0, _attrs(1.0)), *others)
    choice = export_choice(many)
    assert choice is not None and choice[0].number == 0 and "best of 20" in str(choice[1])


@pytest.mark.parametrize(
    "trials",
    [
        # the published model is further than a standard error below
        ((0.80, _attrs(0.80, reference="fcn")), (0.90, _attrs(0.90))),
        # 800 samples: 0.98 +- 0.005 tells 0.97 apart
        ((0.97, _attrs(0.97, 800, reference="cnn")), (0.98, _attrs(0.98, 800))),
        # no record of the validation size (a study of the plain Python API)
        ((0.89, _attrs(0.89, None, reference="fcn")), (0.90, _attrs(0.90, None))),
    ],
)
def test_otherwise_the_best_trial_is_chosen(trials: tuple) -> None:
    choice = export_choice(_study(*trials))
    assert choice is not None and choice[0].number == 1 and choice[1] is None


def test_a_perfect_score_still_leaves_one_sample_of_doubt() -> None:
    study = _study((0.98, _attrs(0.98, 50, reference="fcn")), (1.0, _attrs(1.0, 50)))
    choice = export_choice(study)
    assert choice is not None and choice[0].number == 0  # 1/50 = 0.02


def test_several_objectives_and_an_empty_study() -> None:
    multi = _study(
        (0.9, _attrs(0.9, reference="fcn")), (0.95, _attrs(0.95)), directions=("maximize",) * 2
    )
    choice = export_choice(multi)
    assert choice is not None and choice[0].number == 1 and choice[1] is None
    assert export_choice(optuna.create_study(direction="maximize")) is None


def test_a_one_shot_study_exports_a_trained_trial_when_only_published_models_trained() -> None:
    """A one-shot run that ended before its finalists but trained its published models
    exports among those (inherited scores are on another scale), the margin rule applying;
    with nothing trained, the best inherited score."""
    inherited = {_keys.OBJECTIVE_FIDELITY: "inherited"}
    trained = {_keys.OBJECTIVE_FIDELITY: "trained"}
    study = _study(
        (0.9483, {**_attrs(0.95, samples=41, reference="fcn"), **trained}),
        (0.9489, {**_attrs(0.95, samples=41, reference="resnet"), **trained}),
        (0.99, {**_attrs(0.99, samples=41), **inherited}),
        (0.60, {**_attrs(0.60, samples=41), **inherited}),
    )
    choice = export_choice(study)
    assert choice is not None and choice[0].number == 0 and "'fcn'" in str(choice[1])
    untrained = _study((0.6, {**_attrs(0.6), **inherited}), (0.8, {**_attrs(0.8), **inherited}))
    choice = export_choice(untrained)
    assert choice is not None and choice[0].number == 1


def test_on_too_few_validation_samples_the_first_published_model_is_exported() -> None:
    """On 6 validation series (a one-shot holdout of a few dozen) a finalist's 6 of 6 against
    a published model's 4 of 6 is two samples: no value ranks there, and the first published
    model that completed is exported, beyond any margin; on 20 samples the margin rules."""
    few = _study(
        (0.616, _attrs(0.667, 6, reference="fcn")),
        (0.642, _attrs(0.667, 6, reference="resnet")),
        (0.999, _attrs(1.0, 6)),
    )
    choice = export_choice(few)
    assert choice is not None
    trial, why = choice
    assert trial.number == 0 and "'fcn'" in str(why) and "6 validation samples" in str(why)
    assert "too few to rank" in str(why)
    enough = _study(
        (0.616, _attrs(0.65, 20, reference="fcn")),
        (0.999, _attrs(1.0, 20)),
    )
    assert export_choice(enough) == (enough.trials[1], None)
    alone = _study((0.9, _attrs(0.9, 6)), (0.8, _attrs(0.8, 6)))  # nothing published
    assert export_choice(alone) == (alone.trials[0], None)
