"""The `monitoring` compose profile without running it: the real `docker compose config` with and without the
profile, its two entrypoint scripts run by /bin/sh, Prometheus' and Grafana's provisioning files against each
other, and the dashboards checked against Grafana's own schema (grafana-foundation-sdk's types for Grafana 11.6).
Run: tests/run.sh tests/test_monitoring.py

Prometheus itself scraping a proxy and the real vLLM, and every panel's query evaluated there, are in
tests/real_vllm/test_monitoring_real.py; Grafana cannot run here, so its schema stands in for it.
"""
from __future__ import annotations

import enum
import json
import os
import re
import stat
import subprocess
import types
import typing
from pathlib import Path

import pytest
import yaml
from grafana_foundation_sdk.cog import plugins
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard
from prometheus_client.metrics_core import Metric
from test_compose import compose_config as compose_config_of

from proxy.observe import metrics as proxy_metrics
from standins import dashboards
from standins.rawhttp import raw_request

REPO = Path(__file__).resolve().parent.parent
MONITORING = {"prometheus", "grafana"}
PROMETHEUS_YML = yaml.safe_load((REPO / "monitoring" / "prometheus.yml").read_text())
DATASOURCES = yaml.safe_load((REPO / "monitoring/grafana/provisioning/datasources/prometheus.yaml").read_text())
PROVIDERS = yaml.safe_load((REPO / "monitoring/grafana/provisioning/dashboards/coding-stack.yaml").read_text())

# The SDK's panel options and query types are looked up in a registry it fills on request.
plugins.register_default_plugins()


def compose_config(*args: str, env_lines=()) -> dict:
    """`docker compose [args] config` resolved as JSON; env_lines are the project's env file, the shell's stays out."""
    return compose_config_of(env_lines, args=args)


@pytest.fixture(scope="module")
def plain():
    return compose_config()


@pytest.fixture(scope="module")
def profiled():
    return compose_config("--profile", "monitoring")


def mounts(service: dict) -> dict[str, dict]:
    return {v["target"]: v for v in service.get("volumes", [])}


# ---- the profile in compose -----------------------------------------------------------------------

def test_without_the_profile_nothing_changes(plain, profiled):
    assert set(plain["services"]) == {"preflight", "model", "vllm", "proxy", "searxng"}
    assert set(plain.get("volumes", {})) == {"vllm-cache", "proxy-state"}
    # With it, everything else resolves exactly as without it.
    others = {name: s for name, s in profiled["services"].items() if name not in MONITORING}
    assert others == plain["services"]
    assert set(profiled["volumes"]) == {"vllm-cache", "proxy-state", "prometheus-data", "grafana-data"}


def test_the_profile_adds_prometheus_and_grafana_at_pinned_releases(profiled):
    prometheus, grafana = profiled["services"]["prometheus"], profiled["services"]["grafana"]
    assert prometheus["profiles"] == grafana["profiles"] == ["monitoring"]
    assert re.fullmatch(r"docker\.io/prom/prometheus:v\d+\.\d+\.\d+", prometheus["image"])
    assert re.fullmatch(r"docker\.io/grafana/grafana:\d+\.\d+\.\d+", grafana["image"])
    assert (prometheus["container_name"], grafana["container_name"]) == ("coding-stack-prometheus", "coding-stack-grafana")
    assert grafana["depends_on"] == {"prometheus": {"condition": "service_started", "required": True}}


def test_published_on_loopback_only_even_when_the_stack_opens_its_ports():
    # BIND_ADDRESS opens vLLM and the proxy to a LAN; the dashboards are anonymous and stay on this host.
    config = compose_config("--profile", "monitoring", env_lines=["BIND_ADDRESS=0.0.0.0"])
    assert config["services"]["proxy"]["ports"][0]["host_ip"] == "0.0.0.0"  # the setting took effect
    for name, port in (("prometheus", 9090), ("grafana", 3000)):
        [published] = config["services"][name]["ports"]
        assert (published["host_ip"], published["target"], published["published"]) == ("127.0.0.1", port, str(port))


def test_data_lives_in_named_volumes(profiled):
    assert mounts(profiled["services"]["prometheus"])["/prometheus"]["source"] == "prometheus-data"
    assert mounts(profiled["services"]["grafana"])["/var/lib/grafana"]["source"] == "grafana-data"
    for target, service in (("/prometheus", "prometheus"), ("/var/lib/grafana", "grafana")):
        assert mounts(profiled["services"][service])[target]["type"] == "volume"


@pytest.mark.parametrize("service, source, target", [
    ("prometheus", "monitoring/prometheus.yml", "/etc/prometheus/prometheus.yml"),
    ("grafana", "monitoring/grafana/provisioning", "/etc/grafana/provisioning"),
    ("grafana", "monitoring/grafana/dashboards", "/etc/grafana/dashboards"),
])
def test_provisioning_is_mounted_read_only_from_the_repository(profiled, service, source, target):
    mount = mounts(profiled["services"][service])[target]
    assert mount["type"] == "bind" and mount["read_only"] is True
    assert mount["source"] == str(REPO / source) and (REPO / source).exists()
    # A missing file is an error, not an empty folder: compose writes create_host_path out only when it is true.
    assert "create_host_path" not in mount.get("bind", {})


def test_prometheus_reads_the_mounted_config_and_grafana_the_mounted_dashboards(profiled):
    prometheus, grafana = profiled["services"]["prometheus"], profiled["services"]["grafana"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    assert "--storage.tsdb.path=/prometheus" in prometheus["command"]
    [provider] = PROVIDERS["providers"]
    assert provider["type"] == "file" and provider["options"]["path"] == "/etc/grafana/dashboards"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith("/etc/grafana/dashboards/")
    assert (REPO / "monitoring/grafana/dashboards" / home.rsplit("/", 1)[1]).is_file()


# ---- the entrypoints, run for real by /bin/sh ------------------------------------------------------

def run_entrypoint(entrypoint, args, env, replace):
    """A compose entrypoint ([sh, -c, script, $0]) as the container runs it, with container paths replaced."""
    script = entrypoint[2].replace("$$", "$")  # compose's escape, undone when it creates the container
    for old, new in replace.items():
        assert old in script
        script = script.replace(old, new)
    return subprocess.run([entrypoint[0], entrypoint[1], script, *entrypoint[3:], *args], env=env,
                          capture_output=True, text=True, timeout=30)


def fake_program(path: Path, lines) -> None:
    path.write_text("#!/bin/sh\n" + "\n".join(lines) + "\n")
    path.chmod(0o755)


@pytest.mark.parametrize("keys, written", [("k1", "k1"), ("k1,k2", "k1"), ("", "")])
def test_prometheus_gets_the_proxys_key_as_a_file_never_an_argument(tmp_path, keys, written):
    config = compose_config("--profile", "monitoring", env_lines=[f"PROXY_API_KEY={keys}"])
    prometheus = config["services"]["prometheus"]
    assert prometheus["environment"]["PROXY_API_KEY"] == keys == config["services"]["proxy"]["environment"]["PROXY_API_KEY"]
    # A stand-in Prometheus prints its arguments (NUL-separated), then whether the key is still in its environment.
    fake = tmp_path / "prometheus"
    fake_program(fake, ['for a in "$@"; do printf "%s\\0" "$a"; done', 'printf "key:%s" "${PROXY_API_KEY-unset}"'])
    key_file = tmp_path / "proxy-api-key"
    result = run_entrypoint(prometheus["entrypoint"], prometheus["command"],
                            {"PATH": os.environ["PATH"], **prometheus["environment"]},
                            {"/run/prometheus/proxy-api-key": str(key_file), "/bin/prometheus": str(fake)})
    assert result.returncode == 0, result.stderr
    *argv, tail = result.stdout.split("\0")
    assert argv == prometheus["command"] and tail == "key:unset"
    assert key_file.read_text() == written
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    if keys:
        assert not any(keys in a for a in [*prometheus["entrypoint"], *prometheus["command"]])


def test_the_key_file_is_the_one_the_config_reads_in_a_tmpfs_only_prometheus_reads(profiled):
    prometheus = profiled["services"]["prometheus"]
    [proxy_job] = [j for j in PROMETHEUS_YML["scrape_configs"] if j["job_name"] == "coding-stack-proxy"]
    path = proxy_job["authorization"]["credentials_file"]
    assert f"> {path} &&" in prometheus["entrypoint"][2]
    [tmpfs] = prometheus["tmpfs"]
    assert tmpfs == f"{path.rsplit('/', 1)[0]}:uid=65534,gid=65534,mode=0700"


@pytest.mark.parametrize("given", ["", "a-password-from-dot-env"])
def test_grafana_keeps_no_default_admin_password(tmp_path, given):
    config = compose_config("--profile", "monitoring", env_lines=[f"GRAFANA_ADMIN_PASSWORD={given}"])
    grafana = config["services"]["grafana"]
    env = grafana["environment"]
    assert "GF_SECURITY_ADMIN_PASSWORD" not in env and "admin" not in env.values()
    # Read-only without a login, and no one signs up.
    assert (env["GF_AUTH_ANONYMOUS_ENABLED"], env["GF_AUTH_ANONYMOUS_ORG_ROLE"], env["GF_USERS_ALLOW_SIGN_UP"]) == \
        ("true", "Viewer", "false")
    fake = tmp_path / "run.sh"
    fake_program(fake, ['printf "%s|%s" "$GF_SECURITY_ADMIN_PASSWORD" "${GRAFANA_ADMIN_PASSWORD-unset}"'])

    def password() -> str:
        result = run_entrypoint(grafana["entrypoint"], [], {"PATH": os.environ["PATH"], **env}, {"/run.sh": str(fake)})
        assert result.returncode == 0, result.stderr
        value, left = result.stdout.split("|")
        assert left == "unset"
        return value

    first = password()
    if given:
        assert first == given
    else:
        assert re.fullmatch(r"[0-9a-f]{48}", first), first
        assert password() != first  # random, not a constant hidden in the file


# ---- Prometheus' and Grafana's files agree with the stack ---------------------------------------------

def test_prometheus_scrapes_vllm_and_the_proxy_on_the_stacks_network(profiled):
    jobs = {j["job_name"]: j for j in PROMETHEUS_YML["scrape_configs"]}
    assert set(jobs) == {"vllm", "coding-stack-proxy"}
    ports = {name: profiled["services"][name]["ports"][0]["target"] for name in ("vllm", "proxy")}
    assert jobs["vllm"]["static_configs"] == [{"targets": [f"vllm:{ports['vllm']}"]}]
    assert jobs["vllm"].get("metrics_path", "/metrics") == "/metrics"
    assert jobs["coding-stack-proxy"]["static_configs"] == [{"targets": [f"proxy:{ports['proxy']}"]}]
    assert jobs["coding-stack-proxy"]["metrics_path"] == proxy_metrics.PATH


def test_the_datasource_is_the_profiles_prometheus_and_every_panel_uses_it():
    [source] = DATASOURCES["datasources"]
    assert (source["type"], source["url"], source["access"]) == ("prometheus", "http://prometheus:9090", "proxy")
    # $__rate_interval is computed from timeInterval: it must be Prometheus' real scrape interval.
    assert source["jsonData"]["timeInterval"] == PROMETHEUS_YML["global"]["scrape_interval"]
    ref = {"type": "prometheus", "uid": source["uid"]}
    for doc in dashboards.load().values():
        for panel in dashboards.panels(doc):
            assert panel["datasource"] == ref, panel["title"]
            assert panel["targets"] and all(t["datasource"] == ref for t in panel["targets"]), panel["title"]


def test_every_dashboard_has_its_own_uid_and_every_panel_its_own_id():
    docs = dashboards.load()
    assert set(docs) == {"card.json", "agents.json", "scale.json"}
    assert len({d["uid"] for d in docs.values()}) == len(docs)
    for doc in docs.values():
        ids = [p["id"] for p in doc["panels"]] + [p["id"] for r in doc["panels"] for p in r.get("panels", [])]
        assert len(ids) == len(set(ids))


# ---- the dashboards against Grafana's schema --------------------------------------------------------

def type_problems(value, hint, path: str) -> list[str]:
    """Where `value` (an SDK object as Dashboard.from_json built it) breaks its type hints, recursively; the SDK's
    from_json converts nested objects but passes scalars and enums through as the JSON had them."""
    if hint is typing.Any or hint is object:
        return []
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        choices = typing.get_args(hint)
        if value is None:
            return [] if type(None) in choices else [f"{path}: null"]
        # An object is judged by its own class (a Panel or a RowPanel), a scalar by any alternative that fits.
        own = [h for h in choices if isinstance(h, type) and hasattr(h, "from_json") and isinstance(value, h)]
        tries = [type_problems(value, h, path) for h in (own or [h for h in choices if h is not type(None)])]
        return [] if any(not t for t in tries) else min(tries, key=len)
    if origin is typing.Literal:
        return [] if value in typing.get_args(hint) else [f"{path}: {value!r} is not one of {typing.get_args(hint)}"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{path}: {value!r} is not a list"]
        (item,) = typing.get_args(hint)
        return [p for i, v in enumerate(value) for p in type_problems(v, item, f"{path}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{path}: {value!r} is not an object"]
        _, item = typing.get_args(hint)
        return [p for k, v in value.items() for p in type_problems(v, item, f"{path}.{k}")]
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            hint(value)
            return []
        except ValueError:
            return [f"{path}: {value!r} is not one of {[m.value for m in hint]}"]
    if hint is float:
        return [] if isinstance(value, int | float) and not isinstance(value, bool) else [f"{path}: {value!r} is not a number"]
    if hint is int:
        return [] if isinstance(value, int) and not isinstance(value, bool) else [f"{path}: {value!r} is not an integer"]
    if hint in (str, bool):
        return [] if isinstance(value, hint) else [f"{path}: {value!r} is not a {hint.__name__}"]
    if isinstance(hint, type):
        if not isinstance(value, hint):
            return [f"{path}: a {type(value).__name__} where a {hint.__name__} belongs"]
        return [p for name, h in typing.get_type_hints(type(value)).items()
                for p in type_problems(getattr(value, name), h, f"{path}.{name}")]
    return [f"{path}: no rule to check {hint}"]


def lost_in_round_trip(original, encoded, path: str = "") -> list[str]:
    """What of the file the schema's types do not carry: fields they do not know (a typo, a field of another
    Grafana release) and values they change. The types may add defaults; those are not the file's."""
    if isinstance(original, dict):
        if not isinstance(encoded, dict):
            return [f"{path}: became {encoded!r}"]
        return [p for k, v in original.items()
                for p in (lost_in_round_trip(v, encoded[k], f"{path}.{k}") if k in encoded
                          else [f"{path}.{k}: not in Grafana's schema"])]
    if isinstance(original, list):
        if not isinstance(encoded, list) or len(encoded) != len(original):
            return [f"{path}: became {encoded!r}"]
        return [p for i, (a, b) in enumerate(zip(original, encoded, strict=True))
                for p in lost_in_round_trip(a, b, f"{path}[{i}]")]
    same = original == encoded and type(original) is type(encoded)
    return [] if same else [f"{path}: {original!r} became {encoded!r}"]


def schema_problems(doc: dict) -> list[str]:
    parsed = Dashboard.from_json(doc)
    encoded = json.loads(json.dumps(parsed, cls=JSONEncoder))
    return lost_in_round_trip(doc, encoded) + type_problems(parsed, Dashboard, "dashboard")


@pytest.mark.parametrize("name", sorted(dashboards.load()))
def test_each_dashboard_matches_grafanas_schema(name):
    doc = dashboards.load()[name]
    assert schema_problems(doc) == []
    assert dashboards.panels(doc)
    # Time series panels throughout: the schema's types for their options are the ones checked.
    assert {p["type"] for p in dashboards.panels(doc)} == {"timeseries"}


@pytest.mark.parametrize("break_it, problem", [
    (lambda d: d["panels"][1]["fieldConfig"]["defaults"].update(unitt="s"), ".panels[1].fieldConfig.defaults.unitt: not in"),
    (lambda d: d["panels"][1]["gridPos"].update(w="6"), "grid_pos.w: '6' is not an integer"),
    (lambda d: d.update(graphTooltip=7), "graph_tooltip: 7 is not one of"),
    (lambda d: d["panels"][1]["targets"][0].update(legendFormat=3), "legend_format: 3 is not a str"),
    (lambda d: d["panels"][0].update(collapsed="no"), "collapsed: 'no' is not a bool"),
])
def test_the_schema_check_finds_a_broken_dashboard(break_it, problem):
    doc = dashboards.load()["card.json"]
    break_it(doc)
    assert any(problem in p for p in schema_problems(doc)), schema_problems(doc)


# ---- what the panels read ------------------------------------------------------------------------

def proxy_series() -> set[str]:
    """Every series name the proxy's registry can expose (a labelled metric shows none until first used)."""
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"], "gauge": [""]}
    families: list[Metric] = list(proxy_metrics.REGISTRY.collect())
    return {f.name + s for f in families for s in suffixes[f.type]}


def test_every_proxy_series_a_panel_reads_exists():
    read = {m for q in dashboards.queries() for m in q.metrics if m.startswith("proxy_")}
    assert read - proxy_series() == set(dashboards.PENDING)
    # Each area of the issue has its panels: requests, tools, pages, caches, disconnects, SearXNG.
    for family in ("proxy_requests_total", "proxy_time_to_first_byte_seconds_bucket", "proxy_tool_calls_total",
                   "proxy_cache_lookups_total", "proxy_page_fetch_duration_seconds_bucket",
                   "proxy_page_fetch_bytes_total", "proxy_client_disconnects_total",
                   "proxy_searxng_request_duration_seconds_bucket"):
        assert family in read


def test_the_proxy_without_a_key_accepts_prometheus_empty_credentials(proxy):
    # With PROXY_API_KEY empty the key file is empty, and Prometheus then sends a bare "Bearer" (seen with
    # Debian's Prometheus 2.42): the open proxy must answer it, not count it as a wrong key.
    status, _, body = raw_request(proxy.url, "GET", proxy_metrics.PATH, headers={"Authorization": "Bearer"})
    assert status == 200 and b"proxy_requests_total" in body


# ---- the docs -------------------------------------------------------------------------------------------

def test_the_docs_say_how_to_start_it_and_what_each_row_and_panel_means():
    readme = (REPO / "docs" / "operations.md").read_text()
    start = readme.index("## Metrics\n")
    text = readme[start:readme.index("\n## ", start + 1)]
    assert "docker compose --profile monitoring up -d" in text
    assert "http://127.0.0.1:3000" in text
    for doc in dashboards.load().values():
        assert f"**{doc['title']}**" in text
        for panel in doc["panels"]:  # rows and panels alike, each named once in bold with its line
            assert text.count(f"**{panel['title']}**") == 1, panel["title"]
