"""Search that survives blocked engines: one search backend over the SearXNG instances SEARXNG_URL lists, asked in
order within the one search deadline (SEARXNG_TIMEOUT), those failing lately asked last (search_health.Instances);
one retry of an all-engines-failed query on engines not reported failing; and the opt-in keyed fallback
(proxy/backends/search/brave.py) when every instance failed, or first. Every answer's `unresponsive_engines` is counted
and remembered, also when the search had results; the model reads a short note when a fallback, a retry or only
some engines gave its results. Built by proxy/http/wiring.py; tests: tests/test_search_failover.py.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from proxy.backends.search.search import SearchOutcome
from proxy.backends.search.search_health import (
    EngineFailure,
    Engines,
    Instances,
    answering_engines,
    engine_failures,
)
from proxy.backends.search.searxng import Answer
from proxy.backends.state.state import State
from proxy.runtime.cancel import GONE, Cancel

log = logging.getLogger("proxy.search")

# Developer engines answer through APIs that rarely block an address (GitHub, Stack Exchange, PyPI, npm, crates.io,
# MDN...): the retry asks these, by name, when the instance did not list them failing; SearXNG drops names it does
# not have (/work/shared/reference/searxng-api.md), and the bundled instance has them all (searxng/settings.yml).
DEVELOPER_ENGINES = ("github", "stackoverflow", "askubuntu", "mdn", "pypi", "npm", "crates.io", "pkg.go.dev",
                     "docker hub", "arch linux wiki", "mankier")
# SearXNG's category for the developer engines; the retry asks it when every engine it knows by name failed.
DEVELOPER_CATEGORY = "it"
# Shares of what is left of the deadline: a SearXNG instance waits for its slowest engine (6 s in the bundled one),
# Brave's API answers in about a second, so it needs half an instance's share.
INSTANCE_WEIGHT = 1.0
KEYED_WEIGHT = 0.5
# Less than this left is not worth starting another attempt with: no instance answers that fast.
MIN_ATTEMPT = 0.5


@dataclass
class _Step:
    kind: str                      # "instance", "retry" or "keyed"
    url: str = ""                  # the instance asked (instance, retry)
    engines: tuple[str, ...] = ()  # retry: by name
    categories: tuple[str, ...] = ()  # retry: by category

    @property
    def weight(self) -> float:
        return KEYED_WEIGHT if self.kind == "keyed" else INSTANCE_WEIGHT


@dataclass
class _Tried:
    step: _Step
    outcome: SearchOutcome
    failures: list[EngineFailure] = field(default_factory=list)

    @property
    def every_engine_failed(self) -> bool:
        """SearXNG answered (a JSON object listing failing engines) and had nothing: its engines are blocked."""
        return self.outcome.status == "failed" and bool(self.failures)


def short_reason(tried: _Tried) -> str:
    """A failed attempt in a few words, for the note the model reads. Pure."""
    outcome = tried.outcome
    if outcome.timed_out:
        return "it timed out"
    if tried.every_engine_failed:
        return "every engine behind it failed"
    if outcome.error_code == "too_many_requests":
        return "it is rate-limiting"
    if outcome.message.startswith("Search failed: cannot reach"):  # SearXNG.ask's words for a refused connection
        return "it is unreachable"
    return "it answered with an error"


def _retried(step: _Step) -> str:
    if step.engines:
        return "the engines not reported failing (" + ", ".join(step.engines) + ")"
    return f"SearXNG's developer category ({step.categories[0]!r})"


def _without_prefix(message: str) -> str:
    return message.removeprefix("Search failed: ")


@contextmanager
def _attempt(cancel: Cancel) -> Iterator[Cancel]:
    """A Cancel for one attempt, aborted with the search's own (its client leaving), closed after."""
    child = Cancel()
    undo = cancel.on_abort(lambda: child.abort(cancel.reason or GONE))
    try:
        yield child
    finally:
        undo()
        child.close()


class FailoverSearch:
    """The search backend over several SearXNG instances and an optional keyed one; `search()` never raises.

    instances: SearXNG objects in SEARXNG_URL's order, each with `base_url` and `ask()` (an Answer); keyed: a
    backend with search(..., timeout=) or None; on_engine_failure(engine, reason) and on_fallback(kind) are the
    metrics' hooks. Clocks are injectable so tests check cool-downs without waiting.
    """

    def __init__(self, instances: list, timeout: float, keyed=None, keyed_mode: str = "fallback",
                 on_engine_failure: Callable[[str, str], None] | None = None,
                 on_fallback: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 shared: State | None = None):
        self._by_url = {i.base_url: i for i in instances}
        self.timeout = timeout
        self.results = instances[0].results
        self.keyed, self.keyed_mode = keyed, keyed_mode
        self.instances = Instances(self._by_url, clock=clock, wall=wall, shared=shared)  # shared: STATE_URL's store
        self.engines = Engines(wall=wall)
        self._clock, self._wall = clock, wall
        self._on_engine_failure = on_engine_failure
        self._on_fallback = on_fallback
        self._keyed_last: dict = {}

    # ---- the search ---------------------------------------------------------------------------------

    def search(self, query: str, language: str | None = None, limit: int | None = None,
               time_range: str | None = None, cancel: Cancel | None = None) -> SearchOutcome:
        cancel = cancel or Cancel()
        deadline = self._clock() + self.timeout
        steps = [_Step("instance", url) for url in self.instances.order()]
        if self.keyed is not None:
            steps.insert(0 if self.keyed_mode == "always" else len(steps), _Step("keyed"))
        tried: list[_Tried] = []
        retried = False
        while steps:
            # The first attempt's share is of the whole deadline, so one instance gets exactly SEARXNG_TIMEOUT.
            remaining = deadline - self._clock() if tried else self.timeout
            if cancel.fired or (tried and remaining < MIN_ATTEMPT):
                break  # the first attempt always runs, with the whole deadline when it is that short
            step = steps.pop(0)
            # Rounded: the model may read the budget in "did not answer within 7.5 s".
            budget = max(0.01, round(remaining * step.weight / (step.weight + sum(s.weight for s in steps)), 2))
            with _attempt(cancel) as attempt:
                done = self._run(step, query, language, limit, time_range, attempt, budget)
            if attempt.reason == GONE or cancel.fired:
                return done.outcome  # the client left: nobody reads on, and no instance is to blame
            tried.append(done)
            # A retry that finds nothing is no answer: the usual engines failed, so "no results" would mislead.
            if done.outcome.status == "ok" or (done.outcome.status == "empty" and step.kind != "retry"):
                return self._answered(done, tried)
            if not retried and step.kind == "instance" and done.every_engine_failed:
                retried = True  # once per search, after the other instances and before the keyed backend
                at = next((i for i, s in enumerate(steps) if s.kind == "keyed"), len(steps))
                steps.insert(at, self._retry_step(step.url, done.failures))
        return self._all_failed(query, tried)

    def _run(self, step: _Step, query, language, limit, time_range, cancel: Cancel, budget: float) -> _Tried:
        if step.kind == "keyed":
            outcome = self.keyed.search(query, language=language, limit=limit or self.results, time_range=time_range,
                                        cancel=cancel, timeout=budget)
            self._keyed_last = {"at": self._wall(), "status": outcome.status,
                                "error": outcome.message if outcome.status == "failed" else None}
            return _Tried(step, outcome)
        answer = self._by_url[step.url].ask(query, language=language, limit=limit, time_range=time_range,
                                            cancel=cancel, timeout=budget, engines=step.engines,
                                            categories=step.categories)
        failures = self._bookkeep(step, answer, plain=step.kind == "instance" and not time_range)
        done = _Tried(step, answer.outcome, failures)
        # A retry says nothing new about the instance: its usual engines failed, which already cooled it down.
        if cancel.reason != GONE and step.kind == "instance":
            self._judge(done)
        return done

    def _bookkeep(self, step: _Step, answer: Answer, plain: bool) -> list[EngineFailure]:
        """Count and remember the engines an answer lists failing, and the ones that gave its results."""
        if answer.data is None:
            return []
        failures = engine_failures(answer.data)
        for f in failures:
            if self._on_engine_failure:
                self._on_engine_failure(self.engines.label(f.engine), f.reason)
        for change in self.engines.record(step.url, failures, answering_engines(answer.data), plain):
            if change.failing:
                log.warning("search engine %r on %s started failing: %s (%s)", change.engine, change.instance,
                            change.reason, change.message)
            else:
                log.info("search engine %r on %s answers again after %.0f s of %s", change.engine, change.instance,
                         change.seconds, change.reason)
        return failures

    def _judge(self, done: _Tried) -> None:
        """An instance that failed cools down; one that answered (even with nothing) is up again."""
        url = done.step.url
        if done.outcome.status == "failed":
            seconds = self.instances.failed(url, done.outcome.message)
            log.warning("SearXNG %s failed (%s); asked after the others for %.0f s", url, short_reason(done), seconds)
        elif self.instances.succeeded(url):
            log.info("SearXNG %s answers again", url)

    def _retry_step(self, url: str, failures: list[EngineFailure]) -> _Step:
        """The engines not reported failing: those seen giving results and the developer ones, less any failing on
        this instance; when none is left, the developer category, which may hold engines not known by name."""
        failing = {f.engine for f in failures} | self.engines.failing(url)
        names = sorted((self.engines.answering() | set(DEVELOPER_ENGINES)) - failing)
        if names:
            return _Step("retry", url, engines=tuple(names))
        return _Step("retry", url, categories=(DEVELOPER_CATEGORY,))

    # ---- what the model reads -------------------------------------------------------------------------

    def _answered(self, done: _Tried, tried: list[_Tried]) -> SearchOutcome:
        """The answer, with a note when it did not come the usual way (the first instance, all its engines)."""
        outcome, step = done.outcome, done.step
        if step.kind == "retry":
            first_try = next(t for t in tried if t.step.kind == "instance" and t.step.url == step.url)
            dead = ", ".join(f"{f.engine} ({f.message})" for f in first_try.failures[:6])
            note = (f"Every engine of the usual search failed{': ' + dead if dead else ''}; these results come from "
                    f"a retry on {_retried(step)}, so general web pages may be missing.")
            self._fallback("retry")
        elif step.kind == "keyed":
            note = f"From the {self.keyed.name}" + (", because every SearXNG instance failed." if len(tried) > 1 else ".")
            self._fallback("keyed")
        else:
            configured = list(self._by_url)
            failed = {t.step.url: short_reason(t) for t in tried if t is not done and t.step.kind == "instance"}
            ahead = configured[:configured.index(step.url)]
            reasons = [f"{u} {failed.get(u, 'failed lately')}" for u in ahead]
            reasons += [f"{u} {why}" for u, why in failed.items() if u not in ahead]
            if not reasons:
                return outcome
            note = f"Answered by the SearXNG instance at {step.url}, a fallback: " + "; ".join(reasons) + "."
            self._fallback("instance")
        if outcome.status == "ok":
            outcome.notes.insert(0, note)
        else:
            outcome.message = f"{outcome.message} ({note})"
        return outcome

    def _all_failed(self, query: str, tried: list[_Tried]) -> SearchOutcome:
        if not tried:  # only when the client had left before the search started
            return SearchOutcome(query, "failed", error_code="unavailable",
                                 message="Search failed: the client closed the request.")
        if len(tried) == 1:
            return tried[0].outcome
        parts = []
        for t in tried:
            if t.step.kind == "retry":
                parts.append(f"a retry on {_retried(t.step)} " +
                             ("found nothing either." if t.outcome.status == "empty" else "failed too."))
            else:
                parts.append(_without_prefix(t.outcome.message))
        codes = {t.outcome.error_code for t in tried}
        return SearchOutcome(query, "failed", error_code="too_many_requests" if codes == {"too_many_requests"}
                             else "unavailable", timed_out=all(t.outcome.timed_out for t in tried),
                             message="Search failed everywhere it was tried: " + " Then: ".join(parts))

    def _fallback(self, kind: str) -> None:
        if self._on_fallback:
            self._on_fallback(kind)

    # ---- the health view ----------------------------------------------------------------------------

    def health(self) -> dict:
        """GET /proxy/search/health's JSON: this worker's view of each instance, its failing engines, the keyed
        backend (never its key)."""
        failing = self.engines.view()
        instances = [{**view, "engines_failing": failing.get(view["url"], [])} for view in self.instances.view()]
        keyed = None
        if self.keyed is not None:
            last = self._keyed_last
            keyed = {"backend": self.keyed.name, "mode": self.keyed_mode,
                     "last_used": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(last["at"])) if last else None,
                     "last_status": last.get("status"), "last_error": last.get("error")}
        return {"worker_pid": os.getpid(), "deadline_seconds": self.timeout, "instances": instances,
                "engines_seen_answering": sorted(self.engines.answering()), "keyed_fallback": keyed}
