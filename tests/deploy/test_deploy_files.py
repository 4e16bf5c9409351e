"""The deployment files under deploy/: the production instance, the Helm values and the compose
file agree with each other and with what the code location reads, and hold no secret value."""

from __future__ import annotations

import re

import yaml

from nexus_pipelines.settings import PROJECT_ROOT

DEPLOY = PROJECT_ROOT / "deploy"


def _load(name: str) -> dict:
    return yaml.safe_load((DEPLOY / name).read_text())


def test_the_production_instance_config_loads(tmp_path, monkeypatch):
    from dagster._core.instance.config import dagster_instance_config

    for name, value in {"DAGSTER_PG_USERNAME": "dagster", "DAGSTER_PG_PASSWORD": "unused",
                        "DAGSTER_PG_HOST": "127.0.0.1", "DAGSTER_PG_DB": "dagster", "DAGSTER_PG_PORT": "5432"}.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "dagster.yaml").write_text((DEPLOY / "dagster.yaml").read_text())
    config, _ = dagster_instance_config(str(tmp_path))  # validated against Dagster's own schema
    assert config["storage"]["postgres"]["postgres_db"]["hostname"] == {"env": "DAGSTER_PG_HOST"}
    assert config["run_coordinator"]["class"] == "QueuedRunCoordinator"
    assert (config["run_launcher"]["module"], config["run_launcher"]["class"]) == ("dagster_docker", "DockerRunLauncher")
    assert config["run_monitoring"]["enabled"] is True
    limits = {limit["key"] for limit in config["concurrency"]["runs"]["tag_concurrency_limits"]}
    assert {"nexus/writeback-job", "nexus/queue-drain", "nexus/connector-poll", "nexus/receipt-router"} <= limits
    assert config["nux"] == {"enabled": False}  # no community pop-up in the UI


def test_the_helm_values_queue_runs_under_the_same_tag_limits_as_the_instance():
    instance = _load("dagster.yaml")["concurrency"]["runs"]
    queued = _load("helm/values.yaml")["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]
    assert queued["tagConcurrencyLimits"] == instance["tag_concurrency_limits"]
    assert queued["maxConcurrentRuns"] == instance["max_concurrent_runs"]


def test_the_run_tags_the_jobs_set_are_the_ones_the_instance_limits():
    from nexus_pipelines.definitions import defs

    limited = {limit["key"] for limit in _load("dagster.yaml")["concurrency"]["runs"]["tag_concurrency_limits"]}
    repository = defs.get_repository_def()
    tagged = {key for job in repository.get_all_jobs() for key in job.tags if key.startswith("nexus/")}
    assert tagged <= limited, f"run tags no limit covers: {sorted(tagged - limited)}"
    assert {"nexus/writeback-job", "nexus/connector-poll", "nexus/queue-drain"} <= tagged


def test_run_containers_get_every_variable_the_shipped_configs_reference():
    passed = set(_load("dagster.yaml")["run_launcher"]["config"]["env_vars"])
    referenced = set()
    for path in [*(PROJECT_ROOT / "configs" / "jobs").glob("*.yaml"), *(PROJECT_ROOT / "configs" / "connectors" /
                                                                         "examples").glob("*.yaml")]:
        if path.name.endswith(".local.yaml"):
            continue
        text = path.read_text()
        referenced |= set(re.findall(r"_env:\s*([A-Z][A-Z0-9_]+)", text))
        referenced |= set(re.findall(r"^\s*\w+:\s*env:([A-Z][A-Z0-9_]+)", text, flags=re.MULTILINE))
    assert referenced, "no variable found in the shipped configs"
    assert referenced <= passed, f"not passed to run containers: {sorted(referenced - passed)}"
    compose_env = set(yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["x-nexus-env"])
    assert passed <= compose_env, f"the daemon's environment lacks: {sorted(passed - compose_env)}"


def test_the_compose_topology_serves_the_code_location_over_grpc_to_webserver_and_daemon():
    compose = _load("docker-compose.yml")
    services = compose["services"]
    assert set(services) == {"postgres", "dagster_storage", "control_plane", "user_code", "webserver", "daemon"}
    (location,) = _load("workspace.yaml")["load_from"]
    assert location["grpc_server"]["host"] == "user_code"
    assert str(location["grpc_server"]["port"]) in " ".join((DEPLOY / "Dockerfile.user-code").read_text().split())
    assert services["daemon"]["entrypoint"] == ["dagster-daemon", "run"]
    assert services["webserver"]["entrypoint"][0] == "dagster-webserver"
    network = _load("dagster.yaml")["run_launcher"]["config"]["network"]
    assert compose["networks"]["nexus_pipelines"]["name"] == network


def test_the_services_start_only_once_both_schemas_are_made():
    # each of them creates Dagster's missing tables as it starts; two at once on an empty database race
    services = _load("docker-compose.yml")["services"]
    assert services["dagster_storage"]["entrypoint"] == ["dagster", "instance", "migrate"]
    assert services["control_plane"]["entrypoint"] == ["nexus-pipelines", "migrate"]
    for name in ("user_code", "webserver", "daemon"):
        assert services[name]["depends_on"]["dagster_storage"] == {"condition": "service_completed_successfully"}
    assert services["user_code"]["depends_on"]["control_plane"] == {"condition": "service_completed_successfully"}
    for name in ("webserver", "daemon"):  # and the code location they load waited for the control plane's
        assert services[name]["depends_on"]["user_code"] == {"condition": "service_started"}
    for service in services.values():  # each local image is built before the first service that runs it
        assert "build" in service or not service["image"].startswith("nexus-pipelines-")


def test_the_deploy_files_hold_secret_references_never_values():
    compose = _load("docker-compose.yml")
    for anchor in ("x-dagster-storage", "x-nexus-env"):
        for name, value in compose[anchor].items():
            if name.startswith("<<"):
                continue
            assert not re.search(r"SECRET|PASSWORD|TOKEN|KEY|DSN", name) or str(value).startswith("${"), name
    helm = _load("helm/values.yaml")
    (deployment,) = helm["dagster-user-deployments"]["deployments"]
    plain = {entry["name"] for entry in deployment["env"]}
    assert not {name for name in plain if re.search(r"SECRET|PASSWORD|TOKEN|KEY|DSN", name)}
    assert deployment["envSecrets"] == [{"name": "nexus-pipelines-secrets"}]
    assert helm["generatePostgresqlPasswordSecret"] is False and "postgresqlPassword" not in helm["postgresql"]
    example = (DEPLOY / "env.example").read_text()
    assert all(line.split("=", 1)[1] in ("", "dagster", "US") or not re.search(r"SECRET|PASSWORD|TOKEN", line)
               for line in example.splitlines() if "=" in line and not line.startswith("#"))
