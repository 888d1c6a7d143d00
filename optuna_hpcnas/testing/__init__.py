"""Helpers for testing and benchmarking a deployment, as ``optuna.testing`` is for Optuna:
``storages`` (many workers on one storage, every record checked) and ``outages`` (a real
PostgreSQL or Redis server stopped and started under a running search). They start worker
processes and servers; the package itself never imports them."""
