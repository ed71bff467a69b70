"""The proxy's settings as one immutable value, each named once here with its environment variable, its default
and its reader: Config.from_env(os.environ) is the one place the environment is read (proxy-passthrough.py calls
it, and gunicorn.conf.py for gunicorn's own settings), and Config(...) builds one for tests. Each value is checked and put in its working form once, in
__post_init__ (URLs validated, networks parsed, the mode known), so no module parses a setting again; a bad value
is a ValueError whose message names its variable, which proxy-passthrough.py prints as one line.
"""
from __future__ import annotations

import ipaddress
import os
import re
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

STREAM_SEARCH_MODES = ("server", "client")
WEB_FETCH_URL_MODES = ("given", "any")  # proxy/tools/provenance.py: only URLs the conversation gave, or any URL
# When the Brave Search API is asked (BRAVE_SEARCH_MODE): only after every SearXNG instance failed, or first.
BRAVE_SEARCH_MODES = ("fallback", "always")
QUEUE_POLICIES = ("round_robin", "tokens")  # proxy/backends/state/teamstore.py: the fair queue's choice between keys


# ---- readers: one environment string to a value, or a ValueError naming the variable -------------------

def text(name: str, raw: str) -> str:
    return raw


def lowered(name: str, raw: str) -> str:
    return raw.strip().lower()


def whole(name: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be a whole number, not {raw!r}") from None


def number(name: str, raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, not {raw!r}") from None


def flag(name: str, raw: str) -> bool:
    return raw.strip().lower() in ("1", "true", "yes", "on")


def keys(name: str, raw: str) -> tuple[str, ...]:
    """A comma-separated list, blanks dropped."""
    return tuple(k.strip() for k in raw.split(",") if k.strip())


def items(name: str, raw: str) -> tuple[str, ...]:
    """A comma-separated list as written: Config checks and parses each item."""
    return tuple(raw.split(","))


def setting(env: str | tuple[str, ...], default: Any, read: Callable[[str, str], Any] = text, *,
            positive: bool = False, secret: bool = False) -> Any:
    """A Config field read from `env` (the first of several names that is set wins) with `read`; `positive`:
    zero is refused too, where a count or a timeout of zero would make the proxy useless rather than safer
    (caches and caps take 0 to mean off, so they only may not be negative); `secret`: kept out of Config's repr,
    which a traceback or a test failure may print."""
    names = (env,) if isinstance(env, str) else env
    return field(default=default, repr=not secret, metadata={"env": names, "read": read, "positive": positive})


@dataclass(frozen=True)
class Config:
    # Where vLLM listens: http://vllm:8000 inside the compose stack.
    backend_url: str = setting("BACKEND_URL", "http://localhost:18080")
    # Sent to vLLM as `Authorization: Bearer ...` when vLLM runs with --api-key.
    backend_api_key: str = setting("BACKEND_API_KEY", "")
    # The SearXNG instances the searches go to, comma- or space-separated, asked in this order (the next when one
    # fails: proxy/backends/search/failover.py); each must allow format=json.
    searxng_url: str = setting("SEARXNG_URL", "http://host.docker.internal:8889")
    searxng_results: int = setting("SEARXNG_RESULTS", 5, whole, positive=True)
    searxng_timeout: float = setting("SEARXNG_TIMEOUT", 15.0, number, positive=True)
    # Largest SearXNG answer read (4 MiB; five results are a few kB); a bigger one is a failed search.
    searxng_max_bytes: int = setting("SEARXNG_MAX_BYTES", 4 * 1024 * 1024, whole, positive=True)
    # Search rounds one request may run before the client gets an error.
    max_search_iter: int = setting("MAX_SEARCH_ITER", 10, whole, positive=True)
    inject_web_search: bool = setting("INJECT_WEB_SEARCH", True, flag)
    # web_fetch next to web_search (chat), open_page/find_in_page (Responses).
    inject_web_fetch: bool = setting("INJECT_WEB_FETCH", True, flag)
    # "server" runs searches inside streams; "client" passes web_search calls to the client.
    stream_search: str = setting("STREAM_SEARCH", "server", lowered)
    # Number the sources the model reads and turn its [n] markers into each API's citations (off: neither).
    citations: bool = setting("CITATIONS", True, flag)
    connect_timeout: float = setting("CONNECT_TIMEOUT", 10.0, number, positive=True)
    # Longest silence tolerated from vLLM; a 250k-token prefill is minutes of it.
    read_timeout: float = setting("READ_TIMEOUT", 900.0, number, positive=True)
    # SSE comment cadence while a search runs.
    keepalive_interval: float = setting("KEEPALIVE_INTERVAL", 5.0, number, positive=True)
    # Longest a client may take no bytes of its answer before the proxy hangs up on it (and frees its seat on the
    # card): a stream nobody reads otherwise holds the seat until its socket closes (proxy/http/gunicorn_response.py).
    client_write_timeout: float = setting("CLIENT_WRITE_TIMEOUT", 30.0, number, positive=True)
    # 64 MiB: a 253,952-token prompt is about 1 MB of JSON, so this is headroom, not a squeeze.
    max_body_bytes: int = setting("MAX_BODY_BYTES", 64 * 1024 * 1024, whole, positive=True)
    # Comma-separated keys clients must present; empty leaves the proxy open.
    proxy_api_keys: tuple[str, ...] = setting("PROXY_API_KEY", (), keys)
    # A keys file of people's keys (scripts/keys.py writes it; proxy/backends/state/keys.py reads it, again whenever it
    # changes): each a name, a SHA-256 of the key, optional limits. Beside PROXY_API_KEY, which stays the admin key.
    proxy_keys_file: str = setting("PROXY_KEYS_FILE", "")
    # The SQLite file of usage per key, quota windows and the fair queue's tickets, shared by every worker and kept
    # across restarts (the compose volume; the image says /var/lib/proxy). Unset: from_env names a lasting file in the
    # user's state folder (default_state_db), never a temporary one: a restart must not lose a day's usage or quotas.
    proxy_state_db: str = setting("PROXY_STATE_DB", "")
    # Generation requests admitted to vLLM at once (vLLM's --max-num-seqs, which the compose file passes to both);
    # the rest wait in the proxy's fair queue, taken round-robin across keys. 0: no queue, vLLM's own FIFO.
    max_num_seqs: int = setting("MAX_NUM_SEQS", 0, whole)
    # Which key the fair queue serves next: "round_robin" (the key served longest ago) or "tokens" (the key that used
    # the fewest tokens today); docs/operations.md, "Sharing the stack" has the two measured side by side.
    queue_policy: str = setting("QUEUE_POLICY", "round_robin", lowered)
    # Answer unknown model names on /v1/messages (Claude Code's claude-...) with the served model.
    anthropic_any_model: bool = setting("ANTHROPIC_ANY_MODEL", False, flag)
    # open + find commands one /v1/alpha/search request may run (each fetches a page); Codex sends one or two.
    alpha_search_max_pages: int = setting("ALPHA_SEARCH_MAX_PAGES", 10, whole)
    # web_fetch: comma-separated CIDRs exempt from the SSRF refusals (a LAN wiki: 192.168.1.0/24); empty: public
    # only. Kept as parsed networks.
    web_fetch_allowed_networks: tuple = setting("WEB_FETCH_ALLOWED_NETWORKS", (), items)
    # Seconds one fetch may take, redirects included; an agent is blocked on the tool result meanwhile.
    web_fetch_timeout: float = setting("WEB_FETCH_TIMEOUT", 20.0, number, positive=True)
    # 5 MiB of decoded body per page; the rest is never downloaded.
    web_fetch_max_bytes: int = setting("WEB_FETCH_MAX_BYTES", 5 * 1024 * 1024, whole, positive=True)
    # Page text handed to the model, in tokens of ~4 characters; a request may ask for less.
    web_fetch_max_tokens: int = setting("WEB_FETCH_MAX_TOKENS", 20000, whole, positive=True)
    # FETCH_CACHE_TTL is the same under the name beside SEARCH_CACHE_TTL; when set it wins.
    web_fetch_cache_ttl: float = setting(("FETCH_CACHE_TTL", "WEB_FETCH_CACHE_TTL"), 300.0, number)
    # Pages the cache keeps per worker, and their bytes (32 MiB); least recently used out first.
    web_fetch_cache_entries: int = setting("WEB_FETCH_CACHE_ENTRIES", 500, whole)
    web_fetch_cache_bytes: int = setting("WEB_FETCH_CACHE_BYTES", 32 * 1024 * 1024, whole)
    # A PEM bundle trusted instead of the system's CAs, for an allow-listed host with a private CA (the tests).
    web_fetch_ca_file: str = setting("WEB_FETCH_CA_FILE", "")
    # HTML extraction runs in child processes of each worker, each page under a CPU-time and a memory limit (MiB)
    # (a 5 MiB page of ordinary HTML takes a few seconds and a few hundred MiB); a page over one is a tool error.
    web_fetch_extract_processes: int = setting("WEB_FETCH_EXTRACT_PROCESSES", 2, whole, positive=True)
    web_fetch_extract_cpu_seconds: float = setting("WEB_FETCH_EXTRACT_CPU_SECONDS", 10.0, number, positive=True)
    web_fetch_extract_memory_mb: int = setting("WEB_FETCH_EXTRACT_MEMORY_MB", 1024, whole, positive=True)
    # Pages waiting for a free extraction process; more than this at once are refused as busy.
    web_fetch_extract_queue: int = setting("WEB_FETCH_EXTRACT_QUEUE", 16, whole)
    # web_fetch calls run per model turn and per client request; the model reads that it hit the cap.
    web_fetch_max_per_turn: int = setting("WEB_FETCH_MAX_PER_TURN", 10, whole)
    web_fetch_max_per_request: int = setting("WEB_FETCH_MAX_PER_REQUEST", 50, whole)
    # "given": web_fetch (and Codex's open) reads only URLs the conversation gave it, never one the model built
    # (docs/web-tools.md, Security); "any" lets the model fetch any URL. Links of pages read are followed at most
    # WEB_FETCH_LINK_DEPTH pages deep, WEB_FETCH_LINK_BUDGET times from one given URL and WEB_FETCH_LINKS_PER_HOUR
    # times in all, per client (its key or address) over an hour: agents make many requests, and each would
    # otherwise start a fresh budget (issue 39).
    web_fetch_urls: str = setting("WEB_FETCH_URLS", "given", lowered)
    web_fetch_link_depth: int = setting("WEB_FETCH_LINK_DEPTH", 2, whole)
    web_fetch_link_budget: int = setting("WEB_FETCH_LINK_BUDGET", 2, whole)
    web_fetch_links_per_hour: int = setting("WEB_FETCH_LINKS_PER_HOUR", 24, whole)
    # The MCP server at /mcp (docs/web-tools.md, "Web tools over MCP"). Browser origins allowed to call it (a request
    # with any other Origin header gets a 403 and runs nothing: DNS rebinding); MCP clients send none. And the page
    # reads per client and hour of URLs no search or page of that client gave (a person typed them, or the model
    # wrote them): an MCP server does not see the conversation, so this budget stands in for "the URL was given".
    mcp_allowed_origins: tuple[str, ...] = setting("MCP_ALLOWED_ORIGINS", (), keys)
    mcp_unsourced_per_hour: int = setting("MCP_UNSOURCED_PER_HOUR", 30, whole)
    # Seconds a search answer with results is reused (agents repeat queries within minutes); 0 turns the cache off.
    search_cache_ttl: float = setting("SEARCH_CACHE_TTL", 600.0, number)
    # Bounds of the search cache, per gunicorn worker: answers kept, and their bytes (16 MiB).
    search_cache_entries: int = setting("SEARCH_CACHE_ENTRIES", 1000, whole)
    search_cache_bytes: int = setting("SEARCH_CACHE_BYTES", 16 * 1024 * 1024, whole)
    # What the model read for each of the proxy's calls on /v1/responses (and a failed call's sentence on
    # /v1/messages), kept by the call's id for the turns that replay it: a Responses client keeps only the
    # web_search_call's action, an Anthropic error block only its code, so without this a later turn reads a
    # stand-in line and vLLM's prefix cache misses from there. Seconds kept (an agent session's span), and the
    # bytes kept per gunicorn worker (64 MiB), least recently used out first; 0 in either turns it off.
    responses_results_ttl: float = setting("RESPONSES_RESULTS_TTL", 86400.0, number)
    responses_results_bytes: int = setting("RESPONSES_RESULTS_BYTES", 64 * 1024 * 1024, whole)
    # The proxy's own metrics at /proxy/metrics; off, nothing is recorded.
    proxy_metrics: bool = setting("PROXY_METRICS", True, flag)
    # Where gunicorn's workers keep their metric values so one scrape sums them all (prometheus_client's
    # multiprocess mode reads the same variable at import); the image sets it, and gunicorn.conf.py makes a
    # private one when several workers run without it. Empty: one process's own metrics.
    metrics_dir: str = setting("PROMETHEUS_MULTIPROC_DIR", "")
    # A Brave Search API key turns on the keyed fallback search (proxy/backends/search/brave.py); empty: SearXNG only.
    # Sent to Brave and nowhere else: never logged, never in a repr.
    brave_search_api_key: str = setting("BRAVE_SEARCH_API_KEY", "", secret=True)
    # "fallback": Brave is asked only when every SearXNG instance failed; "always": Brave first, SearXNG when it fails.
    brave_search_mode: str = setting("BRAVE_SEARCH_MODE", "fallback", lowered)
    # Brave's Web Search endpoint; another only for a relay in front of it (or the tests' stand-in).
    brave_search_url: str = setting("BRAVE_SEARCH_URL", "https://api.search.brave.com/res/v1/web/search")
    # Where the proxy's state lives (docs/operations.md, "Shared state"): empty keeps it in each process; redis://host:port/db
    # (a Valkey or Redis server; rediss:// for TLS) shares the caches, Codex's ref ids and the SearXNG cool-downs
    # between workers and replicas, and the team's usage, quotas and fair queue live there instead of PROXY_STATE_DB.
    # Secret: the URL may carry the server's password.
    state_url: str = setting("STATE_URL", "", secret=True)
    # Seconds one call to the state store may take (connect, or send and answer); a store on the same host or LAN
    # answers in a millisecond, and a store that does not is left alone for a while (proxy/backends/state/state.py).
    state_timeout: float = setting("STATE_TIMEOUT", 0.25, number, positive=True)
    # The key of the X-Session-ID hash (proxy/http/affinity.py): every proxy behind one router must share it, or one
    # session's turns get different ids and land on different workers. Empty: one random key in STATE_URL's store
    # when there is one, else a random key per process (gunicorn.conf.py makes one for all its workers;
    # compose.scale.yaml shares one file between replicas).
    session_id_secret: str = setting("SESSION_ID_SECRET", "", secret=True)
    log_level: str = setting("LOG_LEVEL", "info")
    # Where Flask's development server listens (`python proxy-passthrough.py`); gunicorn.conf.py binds it too.
    bind: str = setting("PROXY_BIND", "0.0.0.0:11433")
    # gunicorn's (gunicorn.conf.py takes them from here): worker processes, open connections per worker (each a
    # greenlet), and seconds before a worker that stopped heartbeating is replaced (never a limit on a request).
    workers: int = setting("PROXY_WORKERS", 1, whole, positive=True)
    worker_connections: int = setting("PROXY_WORKER_CONNECTIONS", 1000, whole, positive=True)
    worker_timeout: int = setting("PROXY_WORKER_TIMEOUT", 120, whole, positive=True)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Config:
        """Every setting from the environment: an unset or empty variable keeps its default."""
        values = {}
        for f in fields(cls):
            name = next((n for n in f.metadata["env"] if environ.get(n)), None)
            if name is not None:
                values[f.name] = f.metadata["read"](name, environ[name])
        values.setdefault("proxy_state_db", default_state_db(environ))
        return cls(**values)

    def __post_init__(self):
        if self.stream_search not in STREAM_SEARCH_MODES:
            raise ValueError(f"STREAM_SEARCH must be 'server' or 'client', not {self.stream_search!r}")
        if self.web_fetch_urls not in WEB_FETCH_URL_MODES:
            raise ValueError(f"WEB_FETCH_URLS must be 'given' or 'any', not {self.web_fetch_urls!r}")
        for name in ("backend_url", "brave_search_url"):
            problem = url_problem(getattr(self, name))
            if problem:
                raise ValueError(f"{variable(name)} must be an http:// or https:// URL ({problem}), "
                                 f"not {getattr(self, name)!r}")
        parse_urls("SEARXNG_URL", self.searxng_url)
        problem = state_url_problem(self.state_url)
        if problem:
            raise ValueError(f"STATE_URL must be redis://host:port/db or rediss://... ({problem}), "
                             f"not {masked_url(self.state_url)!r}")
        if self.queue_policy not in QUEUE_POLICIES:
            raise ValueError(f"QUEUE_POLICY must be 'round_robin' or 'tokens', not {self.queue_policy!r}")
        if self.brave_search_mode not in BRAVE_SEARCH_MODES:
            raise ValueError(f"BRAVE_SEARCH_MODE must be 'fallback' or 'always', not {self.brave_search_mode!r}")
        if self.brave_search_api_key and not re.fullmatch(r"[\x21-\x7e]+", self.brave_search_api_key):
            # Said without the key itself, which must not reach a log.
            raise ValueError("BRAVE_SEARCH_API_KEY has spaces or characters an HTTP header cannot carry")
        # frozen: the one place a field is replaced by its working form
        object.__setattr__(self, "web_fetch_allowed_networks", parse_networks(self.web_fetch_allowed_networks))
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if value < 0 or (value == 0 and f.metadata["positive"]):
                least = "above 0" if f.metadata["positive"] else "0 or more"
                raise ValueError(f"{variable(f.name)} must be {least}, not {value}")


    @property
    def searxng_urls(self) -> tuple[str, ...]:
        """SEARXNG_URL's instances in the order they are asked, each checked in __post_init__."""
        return parse_urls("SEARXNG_URL", self.searxng_url)


def default_state_db(environ: Mapping[str, str]) -> str:
    """PROXY_STATE_DB's default: proxy-state.sqlite3 in the XDG state folder ($XDG_STATE_HOME when it is an absolute
    path, else ~/.local/state), under coding-stack/. Every proxy of one user on one host shares it, as it shares the
    one vLLM they front; set PROXY_STATE_DB apart for stacks that must not. Pure."""
    base = environ.get("XDG_STATE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "coding-stack", "proxy-state.sqlite3")


def parse_networks(text) -> tuple:
    """WEB_FETCH_ALLOWED_NETWORKS (comma-separated CIDRs, or a sequence of them) -> networks; ValueError names a bad one."""
    items = text.split(",") if isinstance(text, str) else list(text)
    networks = []
    for item in (str(i).strip() for i in items):
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError as e:
            raise ValueError(f"WEB_FETCH_ALLOWED_NETWORKS: {item!r} is not a network in CIDR form ({e})") from None
    return tuple(networks)


def url_problem(url: str) -> str | None:
    """Why `url` is no base URL the proxy can call (a scheme it does not speak, no host, a port that is not one,
    a list of several), or None. Pure."""
    if not isinstance(url, str):
        return "one URL"
    return _server_url_problem(url, ("http", "https"))[0]


def state_url_problem(url: str) -> str | None:
    """Why STATE_URL names no Valkey/Redis server the proxy can use (empty is fine: no shared state), or None. Pure."""
    if not url:
        return None
    problem, parts = _server_url_problem(url, ("redis", "rediss"))
    if problem is None and parts is not None and parts.path.strip("/") and not parts.path.strip("/").isdigit():
        return "a database number"
    return problem


def _server_url_problem(url: str, schemes: tuple[str, ...]) -> tuple[str | None, urllib.parse.SplitResult | None]:
    """What a server's URL lacks (one URL, a valid port, one of `schemes`, a host), or None; with its parts. Pure."""
    if any(c in url for c in " ,\t\n"):
        return "one URL", None
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError on a port that is not a number from 0 to 65535)
    except ValueError:
        return "a valid port", None
    if parts.scheme not in schemes:
        return " or ".join(schemes), parts
    if not parts.hostname:
        return "a host", parts
    return None, parts


def masked_url(url: str) -> str:
    """A URL fit for a message: its password (or whatever stands before the @) never shown. Pure."""
    scheme, sep, rest = url.partition("://")
    host = rest.partition("/")[0]
    if "@" not in host:
        return url
    return f"{scheme}{sep}***@{rest.partition('@')[2]}"


def parse_urls(name: str, text: str) -> tuple[str, ...]:
    """The base URLs in a comma- or space-separated list, in order, each once and without a trailing slash; a
    ValueError naming the variable and the first that cannot be asked (url_problem's reasons, credentials the
    proxy would not send, shown masked, or a query). Pure."""
    urls: list[str] = []
    for item in re.split(r"[,\s]+", text.strip()):
        if not item:
            continue
        parts = urllib.parse.urlsplit(item)
        if "@" in parts.netloc:
            hidden = parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]).geturl()
            raise ValueError(f"{name}: {hidden!r} carries a user name or password, which the proxy does not send")
        problem = url_problem(item)
        if problem:
            raise ValueError(f"{name} must be an http:// or https:// URL ({problem}), not {item!r}")
        if parts.query or parts.fragment:
            raise ValueError(f"{name}: {item!r} has a query or fragment; give the instance's base URL")
        url = item.rstrip("/")
        if url not in urls:
            urls.append(url)
    if not urls:
        raise ValueError(f"{name} names no URL")
    return tuple(urls)


def variable(field_name: str) -> str:
    """The environment variable a field comes from, for messages."""
    return next(f.metadata["env"][-1] for f in fields(Config) if f.name == field_name)


def variables() -> list[str]:
    """Every environment variable Config reads, in its order (docs/configuration.md documents each)."""
    return [name for f in fields(Config) for name in f.metadata["env"]]
