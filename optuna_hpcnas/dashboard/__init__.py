"""optuna-dashboard for architecture searches: metric names, user attributes, custom plots.

Importing this package imports neither plotly nor optuna-dashboard; the functions do.
"""

from __future__ import annotations

from optuna_hpcnas.dashboard._dashboard import DashboardCallback
from optuna_hpcnas.dashboard._dashboard import launch_dashboard
from optuna_hpcnas.dashboard._dashboard import PARETO_PLOT_ID
from optuna_hpcnas.dashboard._dashboard import plot_pareto_front
from optuna_hpcnas.dashboard._dashboard import plot_search_trajectory
from optuna_hpcnas.dashboard._dashboard import prepare_study
from optuna_hpcnas.dashboard._dashboard import record_trial
from optuna_hpcnas.dashboard._dashboard import save_dashboard_plots
from optuna_hpcnas.dashboard._dashboard import TRAJECTORY_PLOT_ID

__all__ = [
    "DashboardCallback",
    "PARETO_PLOT_ID",
    "TRAJECTORY_PLOT_ID",
    "launch_dashboard",
    "plot_pareto_front",
    "plot_search_trajectory",
    "prepare_study",
    "record_trial",
    "save_dashboard_plots",
]
