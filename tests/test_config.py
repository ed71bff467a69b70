"""Settings are read once and checked once: a bad value stops the proxy at start with one line naming the
variable (as gunicorn and `docker compose logs proxy` show it), and Config holds every value in its working form.

Run: tests/run.sh tests/test_config.py
"""
import ast
import ipaddress
import os
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.core.config import Config, default_state_db, variables

ROOT = Path(__file__).resolve().parent.parent
# Load the entry point as gunicorn does (it builds the app and serves nothing): a config error exits there.
LOAD = "import runpy; runpy.run_path('proxy-passthrough.py', run_name='proxy_passthrough')"


def load(**env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.isupper() or k in ("PATH", "HOME", "LANG")}
    return subprocess.run([sys.executable, "-c", LOAD], cwd=ROOT, env={**clean, "PROXY_METRICS": "false", **env},
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("name, value, message", [
    ("SEARXNG_RESULTS", "five", "SEARXNG_RESULTS must be a whole number, not 'five'"),
    ("READ_TIMEOUT", "soon", "READ_TIMEOUT must be a number, not 'soon'"),
    ("STREAM_SEARCH", "sometimes", "STREAM_SEARCH must be 'server' or 'client', not 'sometimes'"),
    ("WEB_FETCH_ALLOWED_NETWORKS", "10.0.0.0/8,nonsense", "WEB_FETCH_ALLOWED_NETWORKS: 'nonsense' is not a network"),
    ("MAX_SEARCH_ITER", "0", "MAX_SEARCH_ITER must be above 0, not 0"),
    ("SEARCH_CACHE_TTL", "-1", "SEARCH_CACHE_TTL must be 0 or more, not -1.0"),
    ("WEB_FETCH_MAX_PER_TURN", "-3", "WEB_FETCH_MAX_PER_TURN must be 0 or more, not -3"),
    ("WEB_FETCH_URLS", "some", "WEB_FETCH_URLS must be 'given' or 'any', not 'some'"),
    ("WEB_FETCH_LINK_BUDGET", "-1", "WEB_FETCH_LINK_BUDGET must be 0 or more, not -1"),
    # A URL setting that cannot work is refused at start, not discovered as "an internal error" in every search.
    ("SEARXNG_URL", "searxng:8080", "SEARXNG_URL must be an http:// or https:// URL"),
    ("SEARXNG_URL", "http://:8080/", "SEARXNG_URL must be an http:// or https:// URL (a host)"),
    # each instance of a list is checked, and the line names the bad one
    ("SEARXNG_URL", "http://a:8080, searxng:8080", "SEARXNG_URL must be an http:// or https:// URL (http or https), "
                                                   "not 'searxng:8080'"),
    ("SEARXNG_URL", "http://a:8080,http://b:8080/search?q=x", "SEARXNG_URL: 'http://b:8080/search?q=x' has a query"),
    ("SEARXNG_URL", " , ", "SEARXNG_URL names no URL"),
    ("SEARXNG_URL", "http://a:port", "SEARXNG_URL must be an http:// or https:// URL (a valid port), not 'http://a:port'"),
    ("SEARXNG_URL", "http://me:hunter2@a:8080", "SEARXNG_URL: 'http://***@a:8080' carries a user name or password"),
    ("BRAVE_SEARCH_MODE", "sometimes", "BRAVE_SEARCH_MODE must be 'fallback' or 'always', not 'sometimes'"),
    ("BRAVE_SEARCH_URL", "api.search.brave.com", "BRAVE_SEARCH_URL must be an http:// or https:// URL (http or https)"),
    ("BACKEND_URL", "http://vllm:80000", "BACKEND_URL must be an http:// or https:// URL (a valid port)"),
    ("BACKEND_URL", "ftp://vllm:8000", "BACKEND_URL must be an http:// or https:// URL (http or https)"),
    ("STATE_URL", "valkey:6379", "STATE_URL must be redis://host:port/db or rediss://... (redis or rediss), "
                                 "not 'valkey:6379'"),
    ("STATE_URL", "http://valkey:6379/0", "STATE_URL must be redis://host:port/db or rediss://... (redis or rediss)"),
    ("STATE_URL", "redis://valkey:99999/0", "(a valid port)"),
    ("STATE_URL", "redis:///0", "(a host)"),
    ("STATE_URL", "redis://valkey:6379/cache", "(a database number)"),
    ("STATE_URL", "redis://a:6379/0 redis://b:6379/0", "(one URL)"),
    # A password in it is the store's: never shown, in the message either.
    ("STATE_URL", "redis://:hunter2@valkey:6379/x", "not 'redis://***@valkey:6379/x'"),
    ("STATE_TIMEOUT", "0", "STATE_TIMEOUT must be above 0, not 0"),
])
def test_a_bad_setting_stops_the_proxy_with_one_line_naming_it(name, value, message):
    proc = load(**{name: value})
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("proxy-passthrough.py: ") and message in lines[0], proc.stderr


@pytest.mark.parametrize("env", [{}, {"SEARXNG_RESULTS": "", "SEARCH_CACHE_TTL": "0", "STREAM_SEARCH": "client"},
                                 # Not asked at start: a store that is down is found down on first use.
                                 {"STATE_URL": "redis://:pw@127.0.0.1:1/3"}, {"STATE_URL": "rediss://valkey"}],
                         ids=["defaults", "empty-means-default", "state-url", "state-url-tls"])
def test_good_settings_load(env):
    proc = load(**env)
    assert proc.returncode == 0, proc.stderr


def test_from_env_reads_each_variable_with_its_reader_and_default():
    cfg = Config.from_env({"SEARXNG_RESULTS": "7", "CITATIONS": "off", "PROXY_API_KEY": " a, ,b ", "STREAM_SEARCH": " Client ",
                           "WEB_FETCH_CACHE_TTL": "30", "FETCH_CACHE_TTL": "", "MAX_SEARCH_ITER": ""})
    assert (cfg.searxng_results, cfg.citations, cfg.proxy_api_keys, cfg.stream_search) == (7, False, ("a", "b"), "client")
    assert cfg.web_fetch_cache_ttl == 30.0 and cfg.max_search_iter == Config().max_search_iter  # empty: the default
    assert Config.from_env({"FETCH_CACHE_TTL": "5", "WEB_FETCH_CACHE_TTL": "30"}).web_fetch_cache_ttl == 5.0
    # Every default is Config's own, but PROXY_STATE_DB's, which from_env places in the user's state folder.
    assert Config.from_env({"HOME": "/home/ann"}) == Config(proxy_state_db=default_state_db({"HOME": "/home/ann"}))


@pytest.mark.parametrize("text, urls", [
    ("http://searxng:8080", ("http://searxng:8080",)),
    ("http://a:8080/, https://b.example/searx  http://c:8888,,http://a:8080",
     ("http://a:8080", "https://b.example/searx", "http://c:8888")),
    ("\thttp://[::1]:8888\n", ("http://[::1]:8888",)),
])
def test_searxng_url_is_a_list_in_order(text, urls):
    assert Config(searxng_url=text).searxng_urls == urls
    assert Config.from_env({"SEARXNG_URL": text}).searxng_urls == urls


def test_a_password_in_a_url_or_a_bad_key_is_refused_without_showing_it():
    with pytest.raises(ValueError) as e:
        Config(searxng_url="http://a:8080,https://me:hunter2@b.example")
    assert "hunter2" not in str(e.value) and "https://***@b.example" in str(e.value)
    with pytest.raises(ValueError) as e:
        Config(brave_search_api_key="abc def\r\nX-Injected: 1")
    assert "abc" not in str(e.value) and "BRAVE_SEARCH_API_KEY" in str(e.value)
    cfg = Config.from_env({"BRAVE_SEARCH_API_KEY": "sekrit-key", "BRAVE_SEARCH_MODE": " Always "})
    assert (cfg.brave_search_api_key, cfg.brave_search_mode) == ("sekrit-key", "always")
    assert "sekrit-key" not in repr(cfg)
    assert "hunter2" not in repr(Config(state_url="redis://:hunter2@valkey:6379/0"))


def test_without_state_url_redis_is_never_imported():
    """The embedded default stays as it was: the app is built, a worker's services with it, and redis-py is not
    loaded (tests/test_state.py checks the stores themselves)."""
    code = ("import sys; from proxy.core.config import Config; from proxy.http.app import create_app; "
            "create_app(Config()); assert 'redis' not in sys.modules, 'redis imported'; "
            "create_app(Config(state_url='redis://127.0.0.1:1/0')); assert 'redis' in sys.modules")
    clean = {k: v for k, v in os.environ.items() if not k.isupper() or k in ("PATH", "HOME", "LANG")}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**clean, "PROXY_METRICS": "false"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_url_provenance_is_on_unless_switched_off():
    assert (Config().web_fetch_urls, Config().web_fetch_link_depth, Config().web_fetch_link_budget) == ("given", 2, 2)
    assert Config.from_env({"WEB_FETCH_URLS": " ANY "}).web_fetch_urls == "any"  # read case-blind, spaces ignored


def test_config_holds_networks_parsed_once():
    cfg = Config(web_fetch_allowed_networks=("192.168.1.7/24", "fd00::/8"))
    assert cfg.web_fetch_allowed_networks == (ipaddress.ip_network("192.168.1.0/24"), ipaddress.ip_network("fd00::/8"))
    assert Config(web_fetch_allowed_networks=cfg.web_fetch_allowed_networks) == cfg  # parsed values pass through


@pytest.mark.parametrize("fields, message", [
    ({"stream_search": "both"}, "STREAM_SEARCH"),
    ({"searxng_timeout": 0}, "SEARXNG_TIMEOUT must be above 0"),
    ({"proxy_api_keys": ("k",), "search_cache_bytes": -1}, "SEARCH_CACHE_BYTES must be 0 or more"),
    ({"metrics_dir": "/tmp", "keepalive_interval": -1.0}, "KEEPALIVE_INTERVAL must be above 0"),
])
def test_config_refuses_values_that_cannot_work(fields, message):
    with pytest.raises(ValueError, match=message):
        Config(**fields)


# ---- gunicorn.conf.py takes its settings from Config, never from the environment itself ------------------------

def gunicorn_settings(tmp_path, **env) -> subprocess.CompletedProcess:
    """gunicorn's settings as it resolves them with the shipped gunicorn.conf.py (--print-config serves nothing)."""
    clean = {k: v for k, v in os.environ.items() if not k.isupper() or k in ("PATH", "HOME", "LANG")}
    # a metrics folder given, so several workers make no private one to leave behind
    env = {**clean, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), **env}
    return subprocess.run([sys.executable, "-m", "gunicorn", "--config", "gunicorn.conf.py", "--print-config",
                           "proxy-passthrough:app"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("env, settings", [
    ({}, {"bind": "['0.0.0.0:11433']", "workers": "1", "worker_connections": "1000", "timeout": "120",
          "loglevel": "info"}),
    # empty is the default, as Config.from_env reads every variable
    ({"PROXY_WORKERS": "", "PROXY_WORKER_TIMEOUT": ""}, {"workers": "1", "timeout": "120"}),
    ({"PROXY_BIND": "127.0.0.1:0", "PROXY_WORKERS": "3", "PROXY_WORKER_CONNECTIONS": "64",
      "PROXY_WORKER_TIMEOUT": " 7", "LOG_LEVEL": "DEBUG"},
     {"bind": "['127.0.0.1:0']", "workers": "3", "worker_connections": "64", "timeout": "7", "loglevel": "debug"}),
])
def test_gunicorn_takes_its_settings_from_config(tmp_path, env, settings):
    proc = gunicorn_settings(tmp_path, **env)
    assert proc.returncode == 0, proc.stderr
    printed = {name.strip(): value.strip() for name, _, value in
               (line.partition(" = ") for line in proc.stdout.splitlines())}
    assert {k: printed.get(k) for k in settings} == settings


def test_a_worker_freezes_what_it_has_loaded(tmp_path):
    """gunicorn.conf.py's post_worker_init moves the objects a worker has made by then out of the garbage collector's
    full passes, which a long history's decode sets off (docs/performance.md, "A body read in one call")."""
    clean = {k: v for k, v in os.environ.items() if not k.isupper() or k in ("PATH", "HOME", "LANG")}
    code = ("import gc, runpy; conf = runpy.run_path('gunicorn.conf.py'); import proxy.http.app; "
            "before = gc.get_freeze_count(); conf['post_worker_init'](None); print(before, gc.get_freeze_count())")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**clean, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)})
    before, after = map(int, proc.stdout.split())
    assert before == 0 and after > 10_000, proc.stderr


@pytest.mark.parametrize("name, value, message", [
    ("PROXY_WORKERS", "two", "PROXY_WORKERS must be a whole number, not 'two'"),
    ("PROXY_WORKERS", "0", "PROXY_WORKERS must be above 0, not 0"),
    ("PROXY_WORKER_CONNECTIONS", "-5", "PROXY_WORKER_CONNECTIONS must be above 0, not -5"),
    ("PROXY_WORKER_TIMEOUT", "2m", "PROXY_WORKER_TIMEOUT must be a whole number, not '2m'"),
    ("SEARXNG_RESULTS", "five", "SEARXNG_RESULTS must be a whole number, not 'five'"),  # the master checks all of them
])
def test_a_bad_gunicorn_setting_stops_it_with_one_line_naming_it(tmp_path, name, value, message):
    proc = gunicorn_settings(tmp_path, **{name: value})
    assert proc.returncode != 0 and proc.stdout == ""
    assert proc.stderr.strip() == f"gunicorn.conf.py: {message}", proc.stderr


def environment_reads(tree) -> list[tuple[int, str]]:
    """Each variable a module reads by name: os.environ.get/os.getenv/os.environ[...]/`in os.environ`. Pure."""
    def is_environ(node) -> bool:  # os.environ, not a WSGI request's environ
        return (isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name)
                and node.value.id == "os")

    def literal(node) -> str | None:
        return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None

    reads = []
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute):
            if (node.func.attr == "get" and is_environ(node.func.value)) or node.func.attr == "getenv":
                name = literal(node.args[0])
        elif isinstance(node, ast.Subscript) and is_environ(node.value) and isinstance(node.ctx, ast.Load):
            name = literal(node.slice)
        elif isinstance(node, ast.Compare) and any(is_environ(c) for c in node.comparators):
            name = literal(node.left)
        if name:
            reads.append((node.lineno, name))
    return reads


def test_gunicorn_conf_reads_no_variable_config_owns():
    """Config.from_env is the one reader of the proxy's variables: gunicorn.conf.py takes bind, workers, timeouts
    and the rest from it, and may only write the two variables its forked workers need (its comments say why)."""
    owned = set(variables())
    reads = environment_reads(ast.parse((ROOT / "gunicorn.conf.py").read_text()))
    assert [(line, name) for line, name in reads if name in owned] == []


def test_the_environment_read_check_sees_each_way_of_reading():
    """The check above can fail: each form of a read is found."""
    source = ('os.environ.get("A", "1")\nos.getenv("B")\nx = os.environ["C"]\n"D" in os.environ\n'
              'os.environ["E"] = "w"\nos.environ.pop("F", None)\n')
    assert environment_reads(ast.parse(source)) == [(1, "A"), (2, "B"), (3, "C"), (4, "D")]


@pytest.mark.parametrize("path", sorted([*(ROOT / "proxy").rglob("*.py"), ROOT / "proxy-passthrough.py"]),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_of_the_proxy_reads_a_variable_itself(path):
    """Each goes through Config.from_env (docs/architecture.md, Configuration)."""
    assert environment_reads(ast.parse(path.read_text())) == []
