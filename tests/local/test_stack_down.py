"""`local down` stops every part of the stack on its own: a part already gone (killed, or
its pid file naming a process that is no longer it) is no error and no reason to leave
the others running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psycopg

from nexus_pipelines.local.pidfile import PidFile, alive
from nexus_pipelines.local.stack import LocalStack
from nexus_pipelines.settings import NexusSettings

from .support import free_ports


def test_down_stops_every_part_when_the_simulators_and_postgres_are_already_gone(tmp_path, monkeypatch):
    monkeypatch.delenv("NEXUS_PG_DSN", raising=False)
    stack = LocalStack(NexusSettings(local_dir=tmp_path / "stack", pg_dsn=None), sandbox_ports=free_ports())
    info = stack.up()
    try:
        sandbox_pid = stack.sandbox._pid_file.pid()
        emulator_pid = stack.emulator._pid_file.pid()
        postmaster = int((stack.postgres.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        os.kill(sandbox_pid, signal.SIGKILL)
        os.kill(postmaster, signal.SIGKILL)  # its postmaster.pid stays behind, naming a dead process
        os.waitpid(sandbox_pid, 0)
        stopped = stack.down()
    finally:
        stack.down()
    assert stopped == ["bigquery emulator"]
    assert not alive(emulator_pid)
    status = "\n".join(stack.status())
    assert "postgres       stopped" in status and "bigquery       stopped" in status
    try:
        psycopg.connect(info.pg_dsn, connect_timeout=2).close()
        raise AssertionError("postgres still accepts connections after down")
    except psycopg.OperationalError:
        pass


def test_a_pid_file_naming_a_process_the_stack_did_not_start_is_never_signalled(tmp_path):
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        pid_file = PidFile(tmp_path / "sandbox.pid")
        pid_file.path.write_text(str(stranger.pid))  # a pid the system has given to another process
        assert pid_file.pid() is None
        assert pid_file.stop() is False
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_a_recorded_process_is_found_and_stopped_and_then_is_not_running(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    pid_file = PidFile(tmp_path / "sandbox.pid")
    pid_file.record(child.pid)
    assert pid_file.pid() == child.pid
    assert pid_file.stop() is True
    assert not alive(child.pid)
    assert pid_file.pid() is None and pid_file.stop() is False


def test_a_pid_file_cut_short_by_a_crash_means_not_running(tmp_path):
    pid_file = PidFile(tmp_path / "sandbox.pid")
    pid_file.path.write_text("")
    assert pid_file.pid() is None and pid_file.stop() is False


def test_a_pid_file_of_an_earlier_version_still_stops_the_stack_process_it_names(tmp_path):
    stack_process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--dir", str(tmp_path)])
    pid_file = PidFile(tmp_path / "sandbox.pid")
    pid_file.path.write_text(str(stack_process.pid))  # no start time: written before they were kept
    assert pid_file.pid() == stack_process.pid
    assert pid_file.stop() is True
    assert not alive(stack_process.pid)


def test_a_recorded_process_that_ignores_sigterm_is_killed_and_gone_when_stop_returns(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                              "signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE,
                             text=True)
    assert child.stdout.readline().strip() == "ready"  # SIGTERM is ignored from here on
    pid_file = PidFile(tmp_path / "sandbox.pid")
    pid_file.record(child.pid)
    assert pid_file.stop(grace_s=0.5) is True
    assert not alive(child.pid)
