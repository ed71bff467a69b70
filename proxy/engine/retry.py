"""The proxy's one retry policy for a call to vLLM (the transport tries each attempt once): which failed attempts
go again (retry_reason, pure: tests/test_upstream.py checks it table by table), and send, which runs it for
Exchange.call (proxy/engine/exchange.py).
"""
from __future__ import annotations

from collections.abc import Callable

from proxy.engine.admission import Seat
from proxy.engine.watch import Call, ClientWatch
from proxy.transport.vllm import Backend, UpstreamError, UpstreamResponse

# A gateway's "my upstream is gone" answers, which vllm-router writes as plain text: 502 on the routes it passes
# through (the worker it chose refused or reset: "Backend request failed: ..."), 500 once its own retries of a chat
# or a GET are spent on a worker that is gone ("Request failed: error sending request ..."), 503 with no worker left
# for now. vLLM's own 500/502/503 (an engine error, /health while the engine is dead) are JSON or empty: those are
# vLLM's answer, relayed as they are.
GATEWAY_GONE = (500, 502, 503)


def gateway_gone(up: UpstreamResponse) -> bool:
    """A gateway in front of vLLM (not vLLM) says the worker it chose is gone. Pure."""
    return up.status in GATEWAY_GONE and up.header("content-type").lower().startswith("text/plain")


STALE = "stale"


def retry_reason(failure: UpstreamError | None, gone: int | None, tried: set[str]) -> str | None:
    """The proxy's one retry policy for a call to vLLM (the transport tries each attempt once): why the attempt that
    ended in `failure` (or in a gateway's plain-text `gone` status) goes again, or None; `tried` holds the retries
    spent ("stale", "failed"). Every retry is on a new connection. Pure.

    - "stale": a pooled keep-alive connection failed where the server cannot have acted on the request
      (UpstreamError.stale, http1.may_retry): once, quietly, since it is the pool's hazard, not vLLM's failure.
    - "unreachable": nothing of an answer came (refused, reset or closed before the head); or the gateway's status
      (vllm-router: the worker it chose is gone): once, logged and counted (BackendRetried). Nothing has reached the
      client yet, a failed attempt's generation was aborted with its connection (so the client never sees two
      answers), and behind a router the second try finds a live worker (its circuit breaker opened on the first).
    Never once the head is in: from then on the caller may have sent bytes to the client.
    """
    if failure is not None:
        if failure.stale and STALE not in tried:
            return STALE
        return "unreachable" if failure.unanswered and "failed" not in tried else None
    return str(gone) if gone is not None and "failed" not in tried else None


def send(backend: Backend, method: str, target: str, body: bytes | None, headers: list, watch: ClientWatch | None,
         seat: Seat | None, retrying: Callable[[str, str], None]) -> Call:
    """One call to vLLM on the client's watch, returned once its head is in; raises UpstreamError. An attempt that
    failed goes again as retry_reason says, on a new connection (a pooled one may be the next stale one) and keeping
    the seat: it is the same call to the card, not a new arrival. `retrying(why, reason)` hears of every retry but a
    stale connection's, which is the pool's hazard, not vLLM's failure."""
    tried: set[str] = set()
    while True:
        call = Call(watch, seat)
        try:
            call._response = backend.request(method, target, body, headers, on_open=call.opened, fresh=bool(tried))
        except UpstreamError as e:
            reason = None if call.aborted else retry_reason(e, None, tried)
            if reason is None:
                call.end()
                raise
            why = str(e)
        except BaseException:
            call.end()
            raise
        else:
            gone = call.response.status if gateway_gone(call.response) else None
            reason = None if call.aborted else retry_reason(None, gone, tried)
            if reason is None:
                return call
            why = f"a gateway answered {gone}"
        call.seat = None  # kept for the retry
        call.end()  # a gateway's answer unread: the connection closes, and its short error body goes with it
        tried.add(STALE if reason == STALE else "failed")
        if reason != STALE:
            retrying(why, reason)
