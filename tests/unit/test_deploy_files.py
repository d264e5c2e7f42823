"""docker-compose.yml, the Dockerfile and the configs they mount: Debian's docker-compose validates
the compose file (every profile), HAProxy checks its config as the compose file mounts it, the
pieces point at each other (health checks on /health, the replicas' alias, the dashboard's data
source), the image comes from an official base with nothing downloaded outside the package index,
and every metric the Grafana dashboard queries is one the server serves.

The balancer config is also run for real, as processes: tests/e2e/test_balancer.py.
"""

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from core.engine import EngineStats
from openai_serve.metrics import ServerMetrics
from tests.required_tools import require_tool

ROOT = Path(__file__).parents[2]
COMPOSE = ROOT / "docker-compose.yml"
REPLICAS = ("openai-serve-gpu", "openai-serve-cpu")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.mark.parametrize("profile", [None, "cpu", "gpu"])
def test_docker_compose_validates_the_file(profile: str | None) -> None:
    require_tool("docker-compose", "docker-compose")
    args = ["docker-compose"] + (["--profile", profile] if profile else []) + ["-f", str(COMPOSE), "config", "-q"]
    result = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_haproxy_accepts_its_config_as_mounted() -> None:
    require_tool("haproxy", "haproxy")
    config = ROOT / "configs" / "haproxy" / "haproxy.cfg"
    result = subprocess.run(["haproxy", "-c", "-f", str(config)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_services_point_at_each_other(compose: dict) -> None:
    services = compose["services"]
    for name in REPLICAS:
        replica = services[name]
        assert "/health" in " ".join(replica["healthcheck"]["test"])
        assert replica["networks"]["default"]["aliases"] == ["replicas"]
        assert "model-cache:/root/.cache" in replica["volumes"]
        assert replica["build"] == "." and replica["profiles"] == [name.rsplit("-", 1)[1]]
    devices = services["openai-serve-gpu"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and devices[0]["capabilities"] == ["gpu"]
    haproxy = (ROOT / "configs" / "haproxy" / "haproxy.cfg").read_text()
    assert "./configs/haproxy/haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro" in services["balancer"]["volumes"]
    assert re.search(r"^\s*server-template \S+ \S+ replicas:8000 ", haproxy, re.M)
    assert "option httpchk GET /health" in haproxy
    assert services["open-webui"]["environment"]["OPENAI_API_BASE_URL"] == "http://balancer:8000/v1"
    prometheus = yaml.safe_load((ROOT / "configs" / "prometheus" / "prometheus.yml").read_text())
    assert prometheus["scrape_configs"][0]["dns_sd_configs"][0] == {
        "names": ["replicas"], "type": "A", "port": 8000, "refresh_interval": "10s"}
    for volume in services["grafana"]["volumes"] + services["prometheus"]["volumes"]:
        source = volume.split(":")[0]
        assert not source.startswith("./") or (ROOT / source).exists(), volume


def test_the_image_starts_from_an_official_base_and_downloads_nothing_else() -> None:
    lines = [line.strip() for line in (ROOT / "Dockerfile").read_text().splitlines()]
    assert [line for line in lines if line.startswith("FROM ")] == ["FROM python:3.11-slim"]
    text = "\n".join(lines)
    assert not re.search(r"\b(curl|wget|git clone)\b|^ADD\s+https?:", text, re.M)
    assert "--index-url" not in text and "--extra-index-url" not in text


def served_metric_names() -> set[str]:
    """Every sample name /metrics serves (bucket, sum, count and total included)."""
    stats = EngineStats(*[0] * len(EngineStats.__dataclass_fields__))
    text = ServerMetrics("m", 2048, lambda: stats, lambda: 0).exposition().decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


def test_the_dashboard_queries_only_metrics_the_server_serves() -> None:
    dashboard = json.loads((ROOT / "configs" / "grafana" / "dashboards" / "openai-serve.json").read_text())
    datasource = yaml.safe_load((ROOT / "configs" / "grafana" / "provisioning" / "datasources" / "prometheus.yml")
                                .read_text())["datasources"][0]
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queries += [v["query"]["query"] for v in dashboard["templating"]["list"]]
    used = {name for query in queries for name in re.findall(r"openai_serve:\w+", query)}
    assert len(used) >= 15
    assert used <= served_metric_names(), used - served_metric_names()
    assert {p["datasource"]["uid"] for p in dashboard["panels"]} == {datasource["uid"]}
