from __future__ import annotations

import psycopg
from google.cloud import bigquery

from nexus_pipelines.control.migrations import applied_versions, discover
from nexus_pipelines.local.stack import LocalStack
from nexus_pipelines.settings import NexusSettings

from .support import free_ports


def test_the_stack_starts_from_nothing_is_reused_and_stops(tmp_path, monkeypatch):
    monkeypatch.delenv("NEXUS_PG_DSN", raising=False)
    ports = free_ports()
    stack = LocalStack(NexusSettings(local_dir=tmp_path / "stack", pg_dsn=None), sandbox_ports=ports)
    try:
        first = stack.up()
        assert first.pg_embedded
        assert applied_versions(first.pg_dsn) == [m.version for m in discover()]
        assert "postgres_url: postgresql+psycopg2://" in (first.dagster_home / "dagster.yaml").read_text()
        assert f"export NEXUS_PG_DSN='{first.pg_dsn}'" in first.env_file.read_text()

        again = stack.up()
        assert (again.pg_dsn, again.bq_emulator_url) == (first.pg_dsn, first.bq_emulator_url)
        assert again.migrations_applied == []
        status = "\n".join(stack.status())
        assert f"running {first.pg_dsn}" in status and f"running {first.bq_emulator_url}" in status
        assert f"simulators     running NexusCRM :{ports[0]}" in status
        env = first.env_file.read_text()
        assert f"export NEXUSCRM_BASE_URL='http://127.0.0.1:{ports[0]}'" in env and "export NEXUS_LOCAL_STACK='1'" in env
        import httpx

        assert httpx.get(f"http://127.0.0.1:{ports[1]}/api/v4/projects/278964/issues").status_code == 401
    finally:
        stopped = stack.down()
    assert stopped == ["simulators", "bigquery emulator", "postgres"]
    status = "\n".join(stack.status())
    assert "postgres       stopped" in status and "bigquery       stopped" in status
    try:
        psycopg.connect(first.pg_dsn, connect_timeout=2).close()
        raise AssertionError("postgres still accepts connections after down")
    except psycopg.OperationalError:
        pass


def test_the_bigquery_client_works_against_the_emulator(bq_client, bq_dataset):
    table = f"{bq_dataset}.accounts"
    bq_client.query(f"CREATE TABLE {table} (id STRING, arr NUMERIC)").result()
    bq_client.query(f"INSERT INTO {table} (id, arr) VALUES ('a', 10.5), ('b', 20)").result()
    rows = bq_client.query(
        f"SELECT id, arr FROM {table} WHERE arr > @floor ORDER BY id",
        job_config=bigquery.QueryJobConfig(query_parameters=[bigquery.ScalarQueryParameter("floor", "NUMERIC", "15")]),
    ).result()
    assert [(row.id, str(row.arr)) for row in rows] == [("b", "20.000")] or [row.id for row in rows] == ["b"]

    merge = bq_client.query(
        f"""MERGE {table} T
            USING (SELECT 'a' AS id, NUMERIC '11' AS arr UNION ALL SELECT 'c', NUMERIC '3') S
            ON T.id = S.id
            WHEN MATCHED AND T.arr != S.arr THEN UPDATE SET arr = S.arr
            WHEN NOT MATCHED THEN INSERT (id, arr) VALUES (S.id, S.arr)"""
    )
    merge.result()
    assert merge.num_dml_affected_rows == 2
    assert bq_client.query(f"SELECT count(*) AS n FROM {table}").result().to_dataframe(
        create_bqstorage_client=False
    )["n"][0] == 3


def test_an_unreachable_control_plane_is_one_clear_line_without_the_password(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from nexus_pipelines.cli import main

    dsn = "postgresql://ops:hunter2-secret@127.0.0.1:1/control?connect_timeout=2"
    monkeypatch.setenv("NEXUS_PG_DSN", dsn)
    monkeypatch.setenv("NEXUS_LOCAL_DIR", str(tmp_path))
    result = CliRunner().invoke(main, ["local", "up"])
    assert result.exit_code == 1
    assert "cannot connect to NEXUS_PG_DSN (127.0.0.1:1/control)" in result.output
    assert "hunter2" not in result.output and "Traceback" not in result.output


def test_a_restarted_server_keeps_its_port_so_earlier_shells_still_work(tmp_path):
    from nexus_pipelines.local.postgres import FAST_SETTINGS, EmbeddedPostgres

    server = EmbeddedPostgres(tmp_path / "pg", settings=FAST_SETTINGS)
    first = server.start()
    server.stop()
    try:
        again = server.start()
        assert again.port == first.port
        psycopg.connect(again.dsn(), connect_timeout=5).close()
    finally:
        server.stop()


def test_a_restarted_emulator_keeps_its_port_so_earlier_shells_still_work(tmp_path):
    from nexus_pipelines.local.bigquery_emulator import EmulatorProcess, is_serving

    emulator = EmulatorProcess(tmp_path / "emulator")
    first = emulator.start()
    emulator.stop()
    try:
        again = emulator.start()
        assert again == first and is_serving(again)
    finally:
        emulator.stop()


def test_up_status_and_down_mean_the_embedded_server_in_a_shell_that_sourced_its_env(tmp_path, monkeypatch):
    monkeypatch.delenv("NEXUS_PG_DSN", raising=False)
    root = tmp_path / "stack"
    ports = free_ports()
    first = LocalStack(NexusSettings(local_dir=root, pg_dsn=None), sandbox_ports=ports).up()
    sourced = LocalStack(NexusSettings(local_dir=root, pg_dsn=first.pg_dsn), sandbox_ports=ports)  # `. env` was run
    try:
        assert sourced.down() == ["simulators", "bigquery emulator", "postgres"]  # the server too
        again = sourced.up()  # starts it again instead of refusing a dead DSN
        assert again.pg_embedded and again.pg_dsn == first.pg_dsn
        assert f"running {first.pg_dsn}" in "\n".join(sourced.status())
    finally:
        sourced.down()


def test_up_fails_in_one_line_naming_a_sandbox_port_and_the_process_holding_it(tmp_path, monkeypatch):
    import json
    import os
    import socket

    from click.testing import CliRunner

    from nexus_pipelines.cli import main

    ports = free_ports()
    monkeypatch.delenv("NEXUS_PG_DSN", raising=False)
    monkeypatch.setenv("NEXUS_LOCAL_DIR", str(tmp_path / "stack"))
    monkeypatch.setenv("NEXUS_SANDBOX_PORTS", json.dumps(list(ports)))
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", ports[3]))
    squatter.listen()
    try:
        result = CliRunner().invoke(main, ["local", "up"])
    finally:
        squatter.close()
        LocalStack(NexusSettings(local_dir=tmp_path / "stack", pg_dsn=None, sandbox_ports=ports)).down()
    assert result.exit_code == 1 and "ready" not in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert f"port {ports[3]} is held by pid {os.getpid()} (" in result.output
