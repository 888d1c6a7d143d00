"""A Grafana dashboard for the ``hpcnas_*`` series, and a Prometheus scrape configuration."""

from __future__ import annotations

import json
from typing import Any

from optuna_hpcnas.metrics._server import DEFAULT_METRICS_PORT


def grafana_dashboard(*, title: str = "optuna-hpcnas search", uid: str = "hpcnas") -> dict:
    """The dashboard JSON (import it in Grafana, pick the Prometheus data source): the
    package's ``integrations/grafana/hpcnas-dashboard.json`` with ``title`` and ``uid``."""
    from importlib.resources import files

    text = files("optuna_hpcnas.integrations").joinpath("grafana", "hpcnas-dashboard.json")
    dashboard: dict[str, Any] = json.loads(text.read_text())
    dashboard["title"], dashboard["uid"] = title, uid
    return dashboard


def prometheus_scrape_config(
    *, targets: tuple[str, ...] = (f"127.0.0.1:{DEFAULT_METRICS_PORT}",), interval: str = "15s"
) -> dict[str, Any]:
    """A ``prometheus.yml`` that scrapes the search's ``/metrics`` endpoints."""
    if not targets:
        raise ValueError("`targets` is empty; give at least one host:port.")
    return {
        "global": {"scrape_interval": interval},
        "scrape_configs": [
            {
                "job_name": "hpcnas",
                "metrics_path": "/metrics",
                "static_configs": [{"targets": list(targets)}],
            }
        ],
    }
