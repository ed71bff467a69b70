"""searxng/settings.yml against SearXNG's own rules and the engine list of the pinned release; run: tests/run.sh tests/test_searxng_settings.py.

tests/data/searxng-engines-2026.8.22.tsv is a copy of shared/reference/searxng-engines-2026.8.22.tsv: the built-in
engines of SearXNG commit 9fea41204 (image tag 2026.8.22-9fea41204), generated from that commit's searx/settings.yml.
Refresh it from the new release's searx/settings.yml whenever SEARXNG_IMAGE's pin moves (test_compose checks the pair).
"""
import re
from pathlib import Path

import pytest
import yaml

from proxy.core.config import Config

REPO = Path(__file__).resolve().parent.parent
SETTINGS_TEXT = (REPO / "searxng/settings.yml").read_text()
SETTINGS = yaml.safe_load(SETTINGS_TEXT)


def builtin_engines():
    """{name: (default state, inactive?)} from the release's engine list."""
    engines = {}
    for line in (REPO / "tests/data/searxng-engines-2026.8.22.tsv").read_text().splitlines():
        if line and not line.startswith("#"):
            cols = line.split("\t") + [""] * 5
            engines[cols[0]] = (cols[2], cols[4] == "inactive")
    return engines


BUILTIN = builtin_engines()
ENGINES = SETTINGS["engines"]
NAMES = [e["name"] for e in ENGINES]


def test_engine_list_is_the_real_one():
    # A sanity floor: the copy is the whole list, not a truncated file.
    assert len(BUILTIN) > 300 and "duckduckgo" in BUILTIN


def test_merges_with_searxng_defaults():
    # SearXNG merges when use_default_settings is true or a mapping (searx/settings_loader.py).
    assert SETTINGS["use_default_settings"] is True or isinstance(SETTINGS["use_default_settings"], dict)


def test_json_output_is_enabled():
    assert "json" in SETTINGS["search"]["formats"]


def test_limiter_image_proxy_and_public_mode_are_off():
    server = SETTINGS["server"]
    assert (server["limiter"], server["public_instance"], server["image_proxy"]) == (False, False, False)


def test_no_literal_secret():
    assert "secret_key" not in SETTINGS.get("server", {})
    assert "ultrasecretkey" not in SETTINGS_TEXT
    assert not re.search(r"\b[0-9a-f]{32,}\b", SETTINGS_TEXT)


def test_timeouts_fit_an_agent_waiting_on_a_tool():
    outgoing = SETTINGS["outgoing"]
    assert 0 < outgoing["request_timeout"] <= outgoing["max_request_timeout"] <= 10


def test_a_late_answer_leaves_room_for_a_second_instance():
    # SearXNG answers within max_request_timeout (its slowest engine's wait), so the proxy's one search deadline
    # still holds a second instance's answer after it (the failover in proxy/backends/search/failover.py).
    assert SETTINGS["outgoing"]["max_request_timeout"] <= Config().searxng_timeout / 2


def test_retries_are_few_and_never_of_an_http_error():
    # A retried CAPTCHA or 429 deepens the block; SearXNG retries only broken connections unless told otherwise.
    assert SETTINGS["outgoing"]["retries"] == 1
    assert "retry_on_http_error" not in SETTINGS["outgoing"]
    assert not [e["name"] for e in ENGINES if "retry_on_http_error" in e or "retries" in e]


# SearXNG's suspension keys and their values in the pinned release's built-in settings.yml (which
# use_default_settings merges under this file's), in seconds.
BUILTIN_SUSPENSIONS = {"SearxEngineAccessDenied": 180, "SearxEngineCaptcha": 3600, "SearxEngineTooManyRequests": 180,
                       "cf_SearxEngineCaptcha": 1296000, "cf_SearxEngineAccessDenied": 86400,
                       "recaptcha_SearxEngineCaptcha": 604800}


@pytest.mark.parametrize("key", sorted(BUILTIN_SUSPENSIONS))
def test_no_block_takes_an_engine_away_for_more_than_an_hour(key):
    value = SETTINGS["search"]["suspended_times"].get(key, BUILTIN_SUSPENSIONS[key])
    assert 0 < value <= 3600, f"{key}: {value} s"


def test_suspension_keys_are_searxngs_own():
    # A misspelt key is merged in silently and changes nothing.
    assert set(SETTINGS["search"]["suspended_times"]) <= set(BUILTIN_SUSPENSIONS)


def test_one_captcha_no_longer_costs_the_hour():
    assert SETTINGS["search"]["suspended_times"]["SearxEngineCaptcha"] < BUILTIN_SUSPENSIONS["SearxEngineCaptcha"]


@pytest.mark.parametrize("name", NAMES)
def test_engine_exists_and_is_loadable(name):
    assert name in BUILTIN, f"{name!r} is not a built-in engine of the pinned SearXNG"
    assert not BUILTIN[name][1], f"{name!r} is inactive in this release (never loaded)"


@pytest.mark.parametrize("engine", ENGINES, ids=NAMES)
def test_engine_is_switched_on(engine):
    default_state = BUILTIN[engine["name"]][0]
    assert engine.get("disabled", default_state == "disabled") is False


@pytest.mark.parametrize("engine", ENGINES, ids=NAMES)
def test_engine_answers_plain_searches(engine):
    # The proxy sends no `categories`, so SearXNG only queries `general` engines.
    categories = engine.get("categories", ["general"] if "general" in BUILTIN_CATEGORIES[engine["name"]] else [])
    assert "general" in categories


BUILTIN_CATEGORIES = {line.split("\t")[0]: (line.split("\t") + ["", "", ""])[3]
                      for line in (REPO / "tests/data/searxng-engines-2026.8.22.tsv").read_text().splitlines()
                      if line and not line.startswith("#")}
# Engines whose module puts them in `general` (the TSV shows only categories set in settings.yml).
BUILTIN_CATEGORIES.update({"duckduckgo": "general", "startpage": "general,web", "brave": "general,web",
                           "wikipedia": "general", "mojeek": "general,web"})


def test_keep_only_matches_the_engine_entries():
    keep_only = SETTINGS["use_default_settings"]["engines"]["keep_only"]
    assert sorted(keep_only) == sorted(NAMES) and len(set(NAMES)) == len(NAMES)


@pytest.mark.parametrize("kind,names", [
    ("general web search", {"duckduckgo", "brave", "startpage", "mojeek"}),
    ("code hosting", {"github"}),
    ("Q&A", {"stackoverflow"}),
    ("documentation", {"mdn", "arch linux wiki", "mankier"}),
    ("package registries", {"pypi", "npm", "crates.io", "pkg.go.dev"}),
])
def test_selection_covers_what_a_coding_agent_needs(kind, names):
    assert names <= set(NAMES), f"{kind}: {names - set(NAMES)} missing"


def test_every_engine_has_a_reason():
    lines = SETTINGS_TEXT.splitlines()
    for i, line in enumerate(lines):
        if re.match(r"\s+- name: ", line):
            above = lines[i - 1].strip()
            # A comment right above, or a sibling entry of the same group (its comment covers both).
            assert above.startswith("#") or re.match(r"(- name: |disabled: |categories: )", above), line
