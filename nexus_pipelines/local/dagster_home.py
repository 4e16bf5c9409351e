"""The Dagster instance config shared by the local stack and production.

Both use dagster-postgres and the queued run coordinator with the tag
concurrency limits the jobs rely on. The psycopg2 URL scheme matters: with
SQLAlchemy 2.1 a plain `postgresql://` URL selects psycopg 3, whose parameter
style breaks Dagster's `NOTIFY run_events, %(id)s`.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import yaml

from nexus_pipelines.settings import PROJECT_ROOT

PRODUCTION_CONFIG = PROJECT_ROOT / "deploy" / "dagster.yaml"


def instance_config(storage: dict) -> dict:
    """The production instance config (run coordinator, run tag limits, run monitoring) with
    `storage` in place of its Postgres settings: the tag limits the jobs rely on exist once, in
    deploy/dagster.yaml. With no containers here, runs start as processes of the code location
    (Dagster's default launcher) instead of the production DockerRunLauncher."""
    config = yaml.safe_load(PRODUCTION_CONFIG.read_text())
    config["storage"] = {"postgres": storage}
    config.pop("run_launcher")
    return config


def sqlalchemy_url(dsn: str) -> str:
    """A `postgresql+psycopg2://` URL for the server and database of a libpq DSN."""
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    user = params.get("user", "postgres")
    password = f":{params['password']}" if params.get("password") else ""
    host = params.get("host", "127.0.0.1")
    port = params.get("port", "5432")
    return f"postgresql+psycopg2://{user}{password}@{host}:{port}/{params.get('dbname', 'postgres')}"


def write_local_home(home: Path, dsn: str) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    path = home / "dagster.yaml"
    path.write_text(yaml.safe_dump(instance_config({"postgres_url": sqlalchemy_url(dsn)}), sort_keys=False))
    return path
