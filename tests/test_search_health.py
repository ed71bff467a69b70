"""proxy/backends/search/search_health.py without a network or waiting: the instances' order, cool-down and back-off on a
fake clock, and which engines each instance reports failing (by reason) and when they stop.

Run: tests/run.sh tests/test_search_health.py
"""
import pytest

from proxy.backends.search.search_health import (
    COOL_DOWN_FIRST,
    COOL_DOWN_MAX,
    MAX_ENGINES,
    OTHER,
    REASONS,
    Change,
    EngineFailure,
    Engines,
    Instances,
    answering_engines,
    classify,
    engine_failures,
)

A, B, C = "http://a:8080", "http://b:8080", "http://c:8080"


class Clock:
    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now


@pytest.mark.parametrize("message, reason", [
    # SearXNG's own words (searx/webutils.py), as its JSON answers carry them
    ("Suspended: CAPTCHA", "suspended"),
    ("Suspended: too many requests", "suspended"),
    ("Suspended: timeout", "suspended"),
    ("CAPTCHA", "captcha"),
    ("too many requests", "too_many_requests"),
    ("HTTP error 429", "too_many_requests"),
    ("timeout", "timeout"),
    ("HTTP connection error", "error"),
    ("access denied", "error"),
    ("parsing error", "error"),
    ("unexpected crash", "error"),
    # what a broken or hostile instance may put there
    ("", "error"),
    (None, "error"),
    (42, "error"),
    (["CAPTCHA"], "error"),
])
def test_each_message_has_one_reason(message, reason):
    assert classify(message) == reason and reason in REASONS


@pytest.mark.parametrize("listed, expected", [
    ([["duckduckgo", "CAPTCHA"], ["brave", "Suspended: too many requests"]],
     [EngineFailure("duckduckgo", "captcha", "CAPTCHA"), EngineFailure("brave", "suspended", "Suspended: too many requests")]),
    ([["startpage"]], [EngineFailure("startpage", "error", "no reason given")]),
    # control characters never reach a log line or the model
    ([["mojeek", "Suspended:\x1b[31m CAPTCHA\r\nforged log line"]],
     [EngineFailure("mojeek", "suspended", "Suspended:[31m CAPTCHA forged log line")]),
    ([["docker hub", "timeout"], ["docker hub", "timeout"]], [EngineFailure("docker hub", "timeout", "timeout")]),
    # shapes that are skipped, not trusted
    ([[], "duckduckgo", [None, "x"], [{"a": 1}, "x"], ["bad\x00name", "x"], ["<b>", "x"], ["x" * 61, "x"]], []),
    ("duckduckgo", []),
    (None, []),
])
def test_failures_are_read_from_any_shape(listed, expected):
    assert engine_failures({"unresponsive_engines": listed}) == expected


def test_a_long_message_is_cut_and_many_engines_are_bounded():
    listed = [[f"e{i}", "timeout " * 100] for i in range(MAX_ENGINES * 3)]
    found = engine_failures({"unresponsive_engines": listed})
    assert len(found) == MAX_ENGINES and all(len(f.message) <= 120 for f in found)


@pytest.mark.parametrize("results, names", [
    ([{"url": "u", "engine": "github", "engines": ["github", "brave"]}, {"url": "v", "engine": "mdn"}],
     {"github", "brave", "mdn"}),
    ([{"engines": "github"}, {"engines": [None, 3]}, "x", None], set()),
    ("results", set()),
])
def test_answering_engines(results, names):
    assert answering_engines({"results": results}) == names


# ---- instances: order, cool-down, back-off -----------------------------------------------------

def instances(*urls):
    clock, wall = Clock(), Clock(1_800_000_000.0)
    return Instances(urls, clock=clock, wall=wall), clock


def test_the_configured_order_while_all_are_up():
    inst, _ = instances(A, B, C)
    assert inst.order() == [A, B, C]


def test_a_failed_instance_goes_last_for_its_cool_down_and_comes_back_after():
    inst, clock = instances(A, B, C)
    assert inst.failed(A, "down") == COOL_DOWN_FIRST
    assert inst.order() == [B, C, A]
    clock.now += COOL_DOWN_FIRST - 0.1
    assert inst.order() == [B, C, A]
    clock.now += 0.1
    assert inst.order() == [A, B, C]


def test_back_off_doubles_per_failure_in_a_row_up_to_the_cap_and_resets_on_success():
    inst, clock = instances(A, B)
    seconds = []
    for _ in range(8):
        seconds.append(inst.failed(A, "blocked"))
        clock.now += seconds[-1]  # asked again once its cool-down ended, and failed again
    assert seconds == [min(COOL_DOWN_MAX, COOL_DOWN_FIRST * 2 ** n) for n in range(8)]
    assert seconds[-1] == COOL_DOWN_MAX and seconds[:3] == [30, 60, 120]
    assert inst.succeeded(A) is True and inst.succeeded(A) is False
    assert inst.failed(A, "down again") == COOL_DOWN_FIRST


def test_when_all_cool_down_the_soonest_back_is_asked_first():
    inst, clock = instances(A, B, C)
    inst.failed(A, "x")
    inst.failed(A, "x")  # 60 s
    inst.failed(B, "x")  # 30 s
    clock.now += 1
    inst.failed(C, "x")  # 30 s, a second later than B
    assert inst.order() == [B, C, A]


def test_the_view_says_up_or_cooling_down_and_why():
    inst, clock = instances(A, B)
    inst.failed(A, "Search failed: http://a:8080 answered HTTP 502.")
    clock.now += 10
    inst.succeeded(B)
    a, b = inst.view()
    assert a == {"url": A, "state": "cooling down", "cooling_down_for_seconds": 20.0, "failures_in_a_row": 1,
                 "last_error": "Search failed: http://a:8080 answered HTTP 502.",
                 "last_failure": "2027-01-15T08:00:00Z", "last_success": None}
    assert b["state"] == "up" and b["last_success"] == "2027-01-15T08:00:00Z" and b["last_error"] is None


# ---- engines: failing, recovered, bounded --------------------------------------------------------

def fail(name, reason="captcha", message="CAPTCHA"):
    return EngineFailure(name, reason, message)


def test_an_engine_starts_failing_once_and_stops_when_it_gives_results():
    wall = Clock(1_800_000_000.0)
    eng = Engines(wall=wall)
    assert eng.record(A, [fail("duckduckgo")], {"brave"}, plain=True) == [
        Change(A, "duckduckgo", True, "captcha", "CAPTCHA")]
    wall.now += 60
    assert eng.record(A, [fail("duckduckgo", "suspended", "Suspended: CAPTCHA")], {"brave"}, plain=True) == []
    assert eng.failing(A) == {"duckduckgo"} and eng.failing(B) == set()
    assert eng.view()[A] == [{"engine": "duckduckgo", "reason": "suspended", "message": "Suspended: CAPTCHA",
                              "since": "2027-01-15T08:00:00Z", "last_reported": "2027-01-15T08:01:00Z",
                              "reports": 2}]
    wall.now += 540
    assert eng.record(A, [], {"duckduckgo"}, plain=False) == [
        Change(A, "duckduckgo", False, "suspended", "Suspended: CAPTCHA", 600.0)]
    assert eng.failing(A) == set() and eng.view()[A] == []


@pytest.mark.parametrize("plain, recovered", [(True, True), (False, False)],
                         ids=["a plain search no longer lists it", "a narrowed search tells nothing"])
def test_an_engine_no_longer_listed_stops_failing_only_after_a_plain_search(plain, recovered):
    eng = Engines(wall=Clock())
    eng.record(A, [fail("startpage", "timeout", "timeout")], set(), plain=True)
    changes = eng.record(A, [], {"github"}, plain=plain)
    assert [c.engine for c in changes if not c.failing] == (["startpage"] if recovered else [])
    assert eng.failing(A) == (set() if recovered else {"startpage"})


def test_engines_are_kept_per_instance():
    eng = Engines(wall=Clock())
    eng.record(A, [fail("brave")], set(), plain=True)
    eng.record(B, [], {"github"}, plain=True)
    assert (eng.failing(A), eng.failing(B)) == ({"brave"}, set())
    assert eng.answering() == {"github"}


def test_labels_and_memory_are_bounded_against_invented_names():
    eng = Engines(wall=Clock())
    names = [f"e{i}" for i in range(MAX_ENGINES * 2)]
    eng.record(A, [fail(n) for n in names], set(names), plain=True)
    assert len(eng.failing(A)) == MAX_ENGINES and len(eng.answering()) == MAX_ENGINES
    labels = [eng.label(n) for n in names]
    assert labels[:MAX_ENGINES] == names[:MAX_ENGINES] and set(labels[MAX_ENGINES:]) == {OTHER}
    assert eng.label(names[0]) == names[0]  # a known name keeps its label
