"""Every storage key this package writes, in one place, namespaced ``hpcnas:<component>:<field>``.

Study and trial system attributes are shared by all workers of a study; keeping the names
here stops two components from colliding.
"""

from __future__ import annotations

# Study system attributes.
SEARCH_SPACE = "hpcnas:search_space:definition"

# Constraint names (through ``trial.set_constraint``; Optuna prefixes them itself).
CLUSTER_RANKS_CONSTRAINT = "hpcnas.cluster_ranks"

# Checkpoints. Study system attributes: one manifest per checkpoint, written last.
CHECKPOINT_MANIFEST_PREFIX = "hpcnas:checkpoints:manifest:"
# Trial system attributes set when a signal (SIGTERM/SIGUSR1) stopped the trial for a retry.
CHECKPOINT_PREEMPTED = "hpcnas:checkpoints:preempted"
# Study system attribute per generation of P finished trials: top-k trial numbers and the rest.
CHECKPOINT_GENERATION_PREFIX = "hpcnas:checkpoints:generation:"

# StagedPruner (trial system attributes).
PRUNER_STAGE_VALUE = "hpcnas:pruner:stage_value:"  # + stage name: the value a trial took there
PRUNER_STAGE_REACHED = "hpcnas:pruner:stage_reached"
PRUNER_REASON = "hpcnas:pruner:reason"
PRUNER_EARLY_STOPPED = "hpcnas:pruner:early_stopped"  # step of a patience stop
# + stage name: the stage's Kendall tau within the top when a verdict read it
PRUNER_TOP_FIDELITY = "hpcnas:pruner:top_fidelity:"

# SupernetObjective (trial user attributes: meant for people and dashboards; the CLI and the
# dashboard helpers read the same names).
OBJECTIVE_ARCH = "arch"
OBJECTIVE_ARCH_DESCRIPTION = "arch_description"
OBJECTIVE_FLOPS = "flops"
OBJECTIVE_PARAMS = "params"
OBJECTIVE_LATENCY = "latency_s"
OBJECTIVE_PREDICTED_LATENCY = "predicted_latency_s"
OBJECTIVE_ONNX_LATENCY = "onnx_int8_latency_s"  # [objective] latency = "onnx-int8"
OBJECTIVE_INHERITED_ACCURACY = "inherited_accuracy"
OBJECTIVE_ACCURACY = "accuracy"
OBJECTIVE_STAGE = "stage"
OBJECTIVE_STEPS = "steps"  # optimisation steps the candidate trained
OBJECTIVE_FAIL_REASON = "fail_reason"
OBJECTIVE_EARLY_STOPPED = "early_stopped"
# A published model enqueued by name ([study] enqueue): trained through every stage, never
# pruned, so the export can compare the search's pick with it (``_summary.export_choice``).
OBJECTIVE_REFERENCE = "reference_model"
OBJECTIVE_VALIDATION_SAMPLES = "validation_samples"  # samples the trial's value is pooled over
OBJECTIVE_TIME_CAPPED = "time_capped"  # the step at which [objective] max_trial_seconds ended it
OBJECTIVE_SEARCH_ENDED = "search_ended"  # the step at which the search's timeout ended it
# One-shot mode: "inherited" (scored by the supernet's weights alone) or "trained" (a finalist
# or a published model, through the stages); and the inherited trial a finalist was taken from.
OBJECTIVE_FIDELITY = "fidelity"
OBJECTIVE_FINALIST_OF = "finalist_of"

# --- operations (CLI, dashboard, metrics) -------------------------------------------------
# Study system attributes.
RUN_DATA = "hpcnas:run:data"  # the [data] table the search ran on (JSON), for exports
# Trial system attribute written with the pop that takes a budget trial (RDB storages): the
# popping call's token, so a pop tried again after a lost answer finds the trial it took.
RUN_CLAIM = "hpcnas:run:claim"
# Trial system attribute of a one-shot candidate asked and told on a leader's local copy of
# the study and written in a batch (``run._batches``): the leader's token, so its own copy
# does not read the trial back.
RUN_BATCH_SOURCE = "hpcnas:run:batch_source"
# The number of budget trials the study's runs asked for in all, written before they are queued,
# so a run killed while queuing is resumed with its whole budget.
RUN_BUDGET = "hpcnas:run:budget"
# Trial system attribute of every budget trial (a retry inherits it with ``failed_trial``).
RUN_BUDGET_TRIAL = "hpcnas:run:budget_trial"

# Distributed evaluation (optuna_hpcnas.distributed).
DISTRIBUTED_UTILISATION = "hpcnas:distributed:utilisation"  # study: per-rank time shares (JSON)
DISTRIBUTED_GROUP = "hpcnas:distributed:group"  # trial: index of the evaluation group
DISTRIBUTED_LAYOUT = "hpcnas:distributed:layout"  # trial: "dp x pp on N ranks, engine"
DISTRIBUTED_INFEASIBLE = "hpcnas:distributed:infeasible"  # trial: why it was not run
# trial: seconds from the group taking the trial to its result (a trial asked ahead is
# RUNNING in Optuna from its ask, so datetime_start - datetime_complete overstates it)
DISTRIBUTED_EVALUATION_SECONDS = "hpcnas:distributed:evaluation_seconds"
DISTRIBUTED_SYNC_BYTES = "hpcnas:distributed:sync_bytes"  # study: bytes moved by averaging

# QUBOSampler (optuna_hpcnas.samplers.QUBOSampler): trial system attribute with the sampling
# facts of one ask (fit/solve time, BQM size, feasibility rate, fallback).
QUBO_INFO = "hpcnas:qubo:info"

# EvolutionarySampler (trial system attributes).
EVOLUTION_ORIGIN = "hpcnas:evolution:origin"
"""How a trial's parameters were made: ``{"operation", "parent", "second_parent", "level",
"params"}``; ``params`` lets other workers see a running child before its parameters land."""

# --- storages (optuna_hpcnas.storages) ---------------------------------------------------
# Trial system attributes. A runner-level lease on storages without heartbeats (journal file,
# Redis journal, gRPC proxy): ``{"number": trial number, "expires": epoch seconds}``, renewed
# while the trial runs. The number tells a lease copied into a retry from the retry's own.
STORAGES_LEASE = "hpcnas:storages:lease"
# The process that runs a trial: {"number", "host", "pid", "start"}; a sweep on that host
# fails the trial at once when that process is gone.
STORAGES_OWNER = "hpcnas:storages:owner"
# Why recover_expired_trials failed a trial (set just before the trial is failed).
STORAGES_RECOVERED = "hpcnas:storages:recovered"
# The number of the one retry of a failed trial (``None``: max_retry reached), written in the
# same transaction as the failure and the retry on RDB storages.
STORAGES_RETRY = "hpcnas:storages:retry"
# Load test (optuna_hpcnas.testing.storages), trial user attributes: which worker ran the
# trial, and the number the worker saw (checked against the stored one).
LOADTEST_WORKER = "load_worker"
LOADTEST_NUMBER = "load_number"
# --- samplers ----------------------------------------------------------------------------
# Trial system attribute: the params a sampler proposed for a running trial, written before
# the trial suggests them, so that other workers (EvolutionarySampler and QUBOSampler alike)
# do not propose the same candidate; see optuna_hpcnas/samplers/_proposals.py.
SAMPLER_PROPOSAL = "hpcnas:samplers:proposal"
