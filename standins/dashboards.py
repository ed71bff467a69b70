"""The monitoring profile's Grafana dashboards (monitoring/grafana/dashboards) as the tests read them: every panel's
PromQL, with Grafana's interval variables made concrete for Prometheus' own API. Used by tests/test_monitoring.py
and tests/real_vllm/test_monitoring_real.py; run either with tests/run.sh.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DASHBOARDS = ROOT / "monitoring" / "grafana" / "dashboards"

# What Grafana puts in place of its variables before it asks Prometheus: $__rate_interval is at least four scrape
# intervals (the datasource's timeInterval), $__interval the step. A test evaluates at one instant, so any window
# that covers its traffic will do; 5m does.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "15s", "$__range": "1h"}

# Series another change adds to the proxy; their panels are written for them already, and until then the query
# evaluates (no error) to nothing. None now: proxy_search_engine_failures_total came with the search failover.
PENDING: frozenset[str] = frozenset()

# The dashboards whose queries read series only compose.scale.yaml's router exposes: tests/real_vllm/test_router_real.py
# evaluates them against a real router, the monitoring tier's one-vLLM run leaves them out.
ROUTER_DASHBOARDS = frozenset({"scale.json"})

_METRIC = re.compile(r"\b(?:vllm:|vllm_router_|proxy_)[a-z0-9_:]+")


@dataclass(frozen=True)
class Query:
    dashboard: str   # the file's name
    panel: str       # the panel's title
    ref_id: str
    expr: str        # as Grafana holds it

    @property
    def metrics(self) -> set[str]:
        """The vLLM and proxy series the query reads."""
        return set(_METRIC.findall(self.expr))

    @property
    def promql(self) -> str:
        """The expression with Grafana's variables replaced, as Prometheus receives it."""
        expr = self.expr
        for name, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(name, value)
        return expr


def load() -> dict[str, dict]:
    """{file name: dashboard JSON} for every dashboard file."""
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def panels(dashboard: dict) -> list[dict]:
    """Every panel that shows data, rows left out (a collapsed row holds its panels inside it)."""
    out = []
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            out += panel.get("panels", [])
        else:
            out.append(panel)
    return out


def queries() -> list[Query]:
    return [Query(name, panel["title"], target["refId"], target["expr"])
            for name, doc in load().items() for panel in panels(doc) for target in panel.get("targets", [])]
