"""A Grafana dashboard for the ``hpcnas_*`` series, and a Prometheus scrape configuration."""

from __future__ import annotations

from typing import Any

from optuna_hpcnas.metrics._server import DEFAULT_METRICS_PORT


def _quantile(q: float, histogram: str) -> str:
    return f"histogram_quantile({q}, sum by (le) (rate({histogram}_bucket[5m])))"


# (title, unit, panel type, [(PromQL, legend)]).
_PANELS: tuple[tuple[str, str, str, list[tuple[str, str]]], ...] = (
    (
        "Search progress",
        "percentunit",
        "gauge",
        [("max(hpcnas_search_progress_ratio)", "progress")],
    ),
    (
        "Trials by state",
        "short",
        "timeseries",
        [("max by (state) (hpcnas_trials)", "{{state}}")],
    ),
    (
        "Finished trials per second",
        "ops",
        "timeseries",
        [("sum by (state) (rate(hpcnas_trials_finished_total[5m]))", "{{state}}")],
    ),
    (
        "Evaluation seconds (p50, p95)",
        "s",
        "timeseries",
        [
            (_quantile(0.5, "hpcnas_evaluation_seconds"), "p50"),
            (_quantile(0.95, "hpcnas_evaluation_seconds"), "p95"),
        ],
    ),
    (
        "Compute share per rank",
        "percentunit",
        "timeseries",
        [
            ("hpcnas_rank_compute_share_ratio", "rank {{rank}}"),
            ("sum by (rank) (rate(hpcnas_rank_busy_seconds_total[5m]))", "busy rank {{rank}}"),
        ],
    ),
    (
        "Sampler seconds per ask (p50, p95)",
        "s",
        "timeseries",
        [
            (_quantile(0.5, "hpcnas_sampler_ask_seconds"), "p50"),
            (_quantile(0.95, "hpcnas_sampler_ask_seconds"), "p95"),
        ],
    ),
    (
        "Checkpoint bytes per second",
        "Bps",
        "timeseries",
        [
            ("sum(rate(hpcnas_checkpoint_bytes_total[15m]))", "written"),
            ("sum(rate(hpcnas_checkpoints_total[15m]))", "checkpoints/s"),
        ],
    ),
    (
        "Best value and Pareto front",
        "short",
        "timeseries",
        [
            ("max by (objective) (hpcnas_best_value)", "best {{objective}}"),
            ("max(hpcnas_pareto_front_trials)", "Pareto-front trials"),
            ("max(hpcnas_search_target_trials)", "target trials"),
        ],
    ),
)


def grafana_dashboard(*, title: str = "optuna-hpcnas search", uid: str = "hpcnas") -> dict:
    """The dashboard JSON (import it in Grafana, pick the Prometheus data source)."""
    datasource = {"type": "prometheus", "uid": "${datasource}"}
    panels: list[dict[str, Any]] = []
    for i, (panel_title, unit, kind, queries) in enumerate(_PANELS):
        panels.append(
            {
                "id": i + 1,
                "title": panel_title,
                "type": kind,
                "datasource": datasource,
                "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "targets": [
                    {
                        "refId": chr(ord("A") + j),
                        "datasource": datasource,
                        "expr": expr,
                        "legendFormat": legend,
                    }
                    for j, (expr, legend) in enumerate(queries)
                ],
            }
        )
    return {
        "title": title,
        "uid": uid,
        "tags": ["optuna", "nas", "hpcnas"],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                }
            ]
        },
        "panels": panels,
    }


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
