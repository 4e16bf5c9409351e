"""Strict job config (docs/design/writeback-run.md, "Steps") and safe SQL path resolution."""

from __future__ import annotations

import copy

import pytest
import yaml

from nexus_pipelines.settings import PROJECT_ROOT
from nexus_pipelines.writeback.config import ConfigError, check_target_url, load_config, parse_config, render_sql

from .support import CONFIG_DIR, config_dict


def parse(data):
    return parse_config(data, base_dir=CONFIG_DIR)


def with_change(path: str, value, *, delete: bool = False):
    data = copy.deepcopy(config_dict("src"))
    *parents, last = path.split(".")
    node = data
    for p in parents:
        node = node[p]
    if delete:
        del node[last]
    else:
        node[last] = value
    return data


def test_repository_configs_load():
    for name in ("month_end_arr.yaml", "month_end_arr.local.yaml"):
        loaded = load_config(CONFIG_DIR / name)
        assert loaded.sql_path == PROJECT_ROOT / "sql" / "jobs" / "month_end_arr.sql"
        assert "finance_marts.month_end_arr" in loaded.source_sql()
        assert loaded.config.write.delete_policy == "ignore" and loaded.config.schedule.paused is True
    assert load_config(CONFIG_DIR / "month_end_arr.yaml").config.target.local_mode is False


@pytest.mark.parametrize("path,value", [
    ("surprise", 1),
    ("source.surprise", 1),
    ("target.client_secret", "s3cr3t"),  # a secret value instead of an env-var name
    ("write.upsert_mode", "bulk"),
])
def test_unknown_keys_are_rejected(path, value):
    with pytest.raises(ConfigError, match="unknown key"):
        parse(with_change(path, value))


def test_a_lease_shorter_than_the_longest_crm_batch_call_is_rejected():
    data = config_dict("src", max_attempts=5, max_backoff_seconds=30)
    # 5 attempts x (a 401, the token refresh, the resend) x 100 s of timeouts + 4 x 30 s backoff = 1620 s
    data["write"]["lease_ttl_seconds"] = 1600
    with pytest.raises(ConfigError, match=r"lease_ttl_seconds \(1600\) must be at least 1680"):
        parse(data)
    data["write"]["lease_ttl_seconds"] = 1680
    assert parse(data).config.write.lease_ttl_seconds == 1680
    assert parse(config_dict("src")).config.write.lease_ttl_seconds == 1800  # the default fits the default 5 attempts


def test_api_headroom_is_a_percentage_below_100():
    assert parse(config_dict("src")).config.write.api_headroom_percent == 0
    assert parse(config_dict("src", api_headroom_percent=10)).config.write.api_headroom_percent == 10
    for bad in (-1, 100, "10%"):
        with pytest.raises(ConfigError, match="write.api_headroom_percent"):
            parse(config_dict("src", api_headroom_percent=bad))


@pytest.mark.parametrize("size", [0, -1, 201, 1000])
def test_batch_size_outside_1_to_200_is_rejected(size):
    with pytest.raises(ConfigError, match="write.batch_size"):
        parse(with_change("write.batch_size", size))


@pytest.mark.parametrize("size", [1, 200])
def test_batch_size_bounds_are_accepted(size):
    assert parse(with_change("write.batch_size", size)).config.write.batch_size == size


@pytest.mark.parametrize("policy", ["delete", "soft_delete", "", None])
def test_delete_policy_other_than_ignore_is_rejected(policy):
    with pytest.raises(ConfigError, match="delete_policy"):
        parse(with_change("write.delete_policy", policy))


def test_all_or_none_true_is_rejected():
    with pytest.raises(ConfigError, match="all_or_none"):
        parse(with_change("write.all_or_none", True))


@pytest.mark.parametrize("key", ["base_url_env", "client_id_env", "client_secret_env"])
def test_missing_env_var_names_are_rejected(key):
    with pytest.raises(ConfigError, match=f"target.{key}"):
        parse(with_change(f"target.{key}", None, delete=True))
    with pytest.raises(ConfigError, match=f"target.{key}"):
        parse(with_change(f"target.{key}", ""))
    with pytest.raises(ConfigError, match=f"target.{key}"):
        parse(with_change(f"target.{key}", "https://example.com"))


@pytest.mark.parametrize("sql_path", [
    "../../../etc/passwd.sql",
    "../../../../tmp/x.sql",
    "/etc/hosts",
    str(PROJECT_ROOT / "sql" / "jobs" / "month_end_arr.sql"),  # absolute, even inside the root
])
def test_sql_paths_escaping_the_repository_are_rejected(sql_path):
    with pytest.raises(ConfigError, match="SQL path"):
        parse(with_change("source.sql_file", sql_path))


def test_sql_path_symlink_escaping_the_root_is_rejected(tmp_path):
    outside = tmp_path / "evil.sql"
    outside.write_text("SELECT 1")
    link_dir = tmp_path / "root"
    (link_dir / "configs").mkdir(parents=True)
    (link_dir / "link.sql").symlink_to(outside)
    with pytest.raises(ConfigError, match="escapes"):
        parse_config(with_change("source.sql_file", "../link.sql"), base_dir=link_dir / "configs", root=link_dir)


def test_missing_sql_file_is_rejected():
    with pytest.raises(ConfigError, match="does not exist"):
        parse(with_change("source.readiness_sql_file", "../../sql/jobs/nope.sql"))


def test_sql_path_resolves_relative_to_the_config_file():
    loaded = parse(config_dict("src"))
    assert loaded.readiness_sql_path == PROJECT_ROOT / "sql" / "jobs" / "month_end_arr-readiness.sql"


@pytest.mark.parametrize("path,value", [
    ("schedule.cron", "every day"), ("schedule.timezone", "Mars/Olympus"), ("version", 2),
    ("source.freshness_max_age_minutes", 0), ("write.max_attempts", 0),
    ("source.sql_vars", {"source_dataset": "x; DROP TABLE y"}), ("target.api_version", "v62.0"),
    ("write.batch_size", "200"),  # strict: no string coercion
])
def test_other_invalid_values_are_rejected(path, value):
    with pytest.raises(ConfigError):
        parse(with_change(path, value))


def test_error_messages_are_one_line_and_do_not_echo_values():
    with pytest.raises(ConfigError) as info:
        parse(with_change("target.base_url_env", "https://user:pw@example.com"))
    assert "\n" not in str(info.value) and "pw@" not in str(info.value)


def test_https_required_outside_local_mode():
    assert check_target_url("https://org.my.nexuscrm.example", local_mode=False)
    with pytest.raises(ConfigError, match="https"):
        check_target_url("http://org.my.nexuscrm.example", local_mode=False)
    with pytest.raises(ConfigError, match="https"):
        check_target_url("http://127.0.0.1:8080", local_mode=False)
    assert check_target_url("http://127.0.0.1:8080", local_mode=True)
    with pytest.raises(ConfigError, match="loopback"):
        check_target_url("http://org.my.nexuscrm.example", local_mode=True)


def test_render_sql_requires_every_placeholder():
    assert render_sql("SELECT * FROM `${ds}.t`", {"ds": "a"}) == "SELECT * FROM `a.t`"
    with pytest.raises(ConfigError, match="no value"):
        render_sql("SELECT * FROM `${other}.t`", {"ds": "a"})


def test_a_project_id_with_a_dot_is_a_config_error():
    for section in ("source", "state"):
        data = config_dict("finance_marts")
        data[section]["project"] = "my.project"
        with pytest.raises(ConfigError, match=rf"{section}\.project: .*not a project id"):
            parse_config(data, base_dir=CONFIG_DIR)


def _written(tmp_path, data, replace: tuple[str, str]):
    text = yaml.safe_dump(data, sort_keys=False).replace(*replace, 1)
    path = tmp_path / "job.yaml"
    path.write_text(text)
    line = next(n for n, row in enumerate(text.splitlines(), 1) if replace[1].split("\n")[0] in row)
    return path, line, text.splitlines()[line - 1]


def test_a_bad_value_names_its_line_and_column(tmp_path):
    path, line, row = _written(tmp_path, config_dict("src"), ("batch_size: 200", "batch_size: many"))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    column = row.index("many") + 1
    assert f"write.batch_size (line {line}, column {column}): Input should be a valid integer" in str(info.value)


def test_an_unknown_key_names_the_line_and_column_of_the_key(tmp_path):
    path, line, row = _written(tmp_path, config_dict("src"), ("batch_size: 200", "batch_size: 200\n  batchsize: 5"))
    line += 1  # the inserted key is on the next line
    with pytest.raises(ConfigError, match=rf"write.batchsize \(line {line}, column 3\): unknown key"):
        load_config(path)


def test_a_missing_key_names_the_mapping_that_lacks_it(tmp_path):
    data = config_dict("src")
    del data["source"]["sql_file"]
    path, line, _ = _written(tmp_path, data, ("source:", "source:"))
    with pytest.raises(ConfigError, match=rf"source.sql_file \(line {line + 1}, column 3\): Field required"):
        load_config(path)


def test_a_yaml_syntax_error_names_its_line_and_column_in_one_line(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("source:\n  table: t\n  sql_vars: [a, b\nwrite: {}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}: not valid YAML at line 4, column 6: ") and "\n" not in message
