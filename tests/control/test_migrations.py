from __future__ import annotations

import multiprocessing
import shutil
from pathlib import Path

import pytest

from nexus_pipelines.control.db import connect
from nexus_pipelines.control.migrations import MIGRATIONS_DIR, MigrationError, apply_migrations, applied_versions, discover


def test_applies_every_migration_once_and_reruns_are_idempotent(empty_dsn):
    first = apply_migrations(empty_dsn)
    assert first == [m.path.name for m in discover()]
    assert apply_migrations(empty_dsn) == []
    assert applied_versions(empty_dsn) == [m.version for m in discover()]


def _apply(dsn: str) -> list[str]:
    return apply_migrations(dsn)


def test_two_processes_racing_apply_each_migration_exactly_once(empty_dsn):
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(3) as pool:
        results = pool.map(_apply, [empty_dsn] * 3)
    applied = [name for result in results for name in result]
    assert sorted(applied) == sorted(m.path.name for m in discover())
    with connect(empty_dsn) as conn:
        (count,) = conn.execute("SELECT count(*) FROM schema_migrations").fetchone()
    assert count == len(discover())


def _copy_migrations(tmp_path: Path) -> Path:
    directory = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS_DIR, directory)
    return directory


def test_a_changed_applied_migration_is_refused(empty_dsn, tmp_path):
    directory = _copy_migrations(tmp_path)
    apply_migrations(empty_dsn, directory=directory)
    first = sorted(directory.glob("*.sql"))[0]
    first.write_text(first.read_text() + "\n-- edited after it was applied\n")
    with pytest.raises(MigrationError, match=f"{first.name} was changed after it was applied"):
        apply_migrations(empty_dsn, directory=directory)


def test_a_new_migration_is_applied_after_the_old_ones(empty_dsn, tmp_path):
    directory = _copy_migrations(tmp_path)
    apply_migrations(empty_dsn, directory=directory)
    (directory / "9999_probe.sql").write_text("CREATE TABLE probe (id int);")
    assert apply_migrations(empty_dsn, directory=directory) == ["9999_probe.sql"]
    with connect(empty_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM probe").fetchone() == (0,)


def test_a_failing_migration_applies_nothing(empty_dsn, tmp_path):
    directory = _copy_migrations(tmp_path)
    (directory / "9998_broken.sql").write_text("CREATE TABLE half (id int); SELECT * FROM no_such_table;")
    with pytest.raises(Exception, match="no_such_table"):
        apply_migrations(empty_dsn, directory=directory)
    with connect(empty_dsn) as conn:
        assert conn.execute("SELECT to_regclass('nexus_control.schema_migrations')").fetchone() == (None,)


def test_badly_named_files_are_refused(tmp_path):
    (tmp_path / "1_init.sql").write_text("SELECT 1;")
    with pytest.raises(MigrationError, match="NNNN_snake_name.sql"):
        discover(tmp_path)


def test_the_resource_refuses_a_control_plane_that_is_behind_or_edited(empty_dsn, tmp_path, monkeypatch):
    from nexus_pipelines.control import migrations
    from nexus_pipelines.control.resources import ControlPlaneResource

    resource = ControlPlaneResource(dsn=empty_dsn)
    with pytest.raises(MigrationError, match="no migrations applied"):
        resource.pool()
    apply_migrations(empty_dsn)
    with resource.connection() as conn:
        assert conn.execute("SELECT count(*) FROM leases").fetchone() == (0,)
    resource.close()

    directory = _copy_migrations(tmp_path)
    (directory / "9997_pending.sql").write_text("SELECT 1;")
    monkeypatch.setattr(migrations, "MIGRATIONS_DIR", directory)
    with connect(empty_dsn) as conn:
        with pytest.raises(MigrationError, match="9997_pending.sql is not applied"):
            migrations.check_up_to_date(conn, directory)


def test_the_migrate_command_applies_and_reports(empty_dsn, monkeypatch):
    from click.testing import CliRunner

    from nexus_pipelines.cli import main

    monkeypatch.setenv("NEXUS_PG_DSN", empty_dsn)
    first = CliRunner().invoke(main, ["migrate"])
    assert first.exit_code == 0 and first.output.startswith("applied: 0001_fenced_leases.sql")
    second = CliRunner().invoke(main, ["migrate"])
    assert second.exit_code == 0 and "up to date" in second.output


def test_migrate_against_an_unreachable_server_is_one_line_without_the_password():
    from click.testing import CliRunner

    from nexus_pipelines.cli import main

    result = CliRunner().invoke(main, ["migrate"], env={"NEXUS_PG_DSN": "host=127.0.0.1 port=1 dbname=x password=pw123456"})
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert "cannot reach the control plane at 127.0.0.1:1/x" in result.output and "pw123456" not in result.output
