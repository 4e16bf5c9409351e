"""A relative job config path is taken from the project root whatever the working directory
(the Dagster UI of `make dev` runs in .nexus_local/), and an unreadable one says so."""

from __future__ import annotations

import pytest

from nexus_pipelines.settings import PROJECT_ROOT
from nexus_pipelines.writeback.config import ConfigError, load_config


def test_a_relative_config_path_is_taken_from_the_project_root_not_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # as under `make dev`, which runs Dagster in .nexus_local/
    loaded = load_config("configs/jobs/month_end_arr.local.yaml")
    assert loaded.path == PROJECT_ROOT / "configs" / "jobs" / "month_end_arr.local.yaml"
    assert loaded.config.target.local_mode is True


def test_a_missing_relative_config_path_names_the_project_root_it_was_taken_from(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as error:
        load_config("configs/jobs/no_such_job.yaml")
    assert str(error.value) == (f"cannot read job config {PROJECT_ROOT}/configs/jobs/no_such_job.yaml (a relative "
                                f"config path is taken from the project root {PROJECT_ROOT}): No such file or directory")


def test_an_absolute_config_path_is_read_as_given(tmp_path):
    with pytest.raises(ConfigError) as error:
        load_config(tmp_path / "absent.yaml")
    assert str(error.value) == f"cannot read job config {tmp_path}/absent.yaml: No such file or directory"
