"""web_fetch on /v1/chat/completions, plain and streamed: the model searches, then reads a page,
then answers; seen from the openai SDK, the vLLM stand-in, SearXNG's stand-in and the web site's.

Run: tests/run.sh tests/test_chat_fetch.py
"""
from __future__ import annotations

import json
import re

import pytest
from clients import openai

from proxy.tools.sources import CITE_NOTE
from standins import pdf_files
from standins.vllm_wire import completion, json_reply, sse_reply, stream_frames, tool_call

USER = [{"role": "user", "content": "What does the vLLM changelog say?"}]
NAV = "".join(f'<li><a href="/{w.lower()}">{w}</a></li>' for w in ("Home", "Docs", "Blog", "Community", "Sponsors"))
PAGE = ("<html><head><title>Changelog</title></head><body><nav><ul>" + NAV + "</ul></nav><article><h1>Changelog</h1>"
        + "".join(f"<p>{p} The release notes explain this at length, with benchmarks, migration advice and "
                  "the reasoning behind each change, so that operators can plan their upgrade.</p>"
                  for p in ("vLLM 0.32 adds Gated-DeltaNet prefix caching.", "It ships a faster Marlin kernel for INT4.",
                            "It drops Python 3.9 support."))
        + "</article><footer>Copyright</footer></body></html>")
FACT = "Gated-DeltaNet prefix caching"


@pytest.fixture
def fetching(start_proxy):
    """A proxy that may fetch from loopback, as a LAN allow-list would let it."""
    return start_proxy(KEEPALIVE_INTERVAL="0.2", WEB_FETCH_ALLOWED_NETWORKS="127.0.0.0/8", WEB_FETCH_URLS="any")


def client(proxy):
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0)


def turn(name, args, stream):
    call = tool_call(name, args)
    if stream:
        return sse_reply(stream_frames(tool_calls=[call], finish_reason="tool_calls", include_usage=True))
    return json_reply(completion(tool_calls=[call], finish_reason="tool_calls"))


def answer(text, stream):
    if stream:
        return sse_reply(stream_frames(content=[text], finish_reason="stop", include_usage=True))
    return json_reply(completion(content=text, finish_reason="stop"))


def tool_messages(request) -> list[str]:
    return [m["content"] for m in request.json()["messages"] if m.get("role") == "tool"]


def ask(proxy, stream) -> str:
    c = client(proxy)
    if not stream:
        return c.chat.completions.create(model="foundation", messages=USER).choices[0].message.content
    chunks = c.chat.completions.create(model="foundation", messages=USER, stream=True,
                                       stream_options={"include_usage": True})
    return "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)


@pytest.mark.parametrize("stream", [False, True])
def test_search_then_read_the_page_then_answer(fetching, backend, searxng, site, stream):
    path = f"/changelog-{stream}"  # a path per case: the proxy's page cache outlives a test
    site.route(path, PAGE)
    url = f"http://127.0.0.1:{site.port}{path}"
    backend.script(turn("web_search", {"query": "vllm changelog"}, stream),
                   turn("web_fetch", {"url": url}, stream),
                   answer("It adds prefix caching.", stream))
    assert ask(fetching, stream) == "It adds prefix caching."
    # The site's view: one GET of the page, with the proxy's own honest headers.
    assert [r.path for r in site.requests] == [path]
    assert site.requests[0].headers["user-agent"].startswith("coding-stack-proxy/")
    # SearXNG's and vLLM's: the search ran, then the page's main text came back as the tool result.
    assert searxng.queries == ["vllm changelog"]
    first, _, third = backend.received
    assert [t["function"]["name"] for t in first.json()["tools"]] == ["web_search", "web_fetch"]
    page_text = tool_messages(third)[-1]
    assert page_text.startswith(f'[4] Page {url} "Changelog"') and FACT in page_text  # numbered after 3 results
    assert "Sponsors" not in page_text and "Copyright" not in page_text  # navigation is not the page's content


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("url, phrase", [
    ("http://127.0.0.1:{port}/changelog", "only reads public addresses"),  # loopback, not allow-listed here
    ("http://169.254.169.254/latest/meta-data/", "cloud metadata address"),  # cloud metadata
    ("file:///etc/passwd", "http and https"),
    ("http://user:pw@example.com/", "credentials"),
])
def test_refused_urls_are_tool_results_the_model_reads(start_proxy, backend, site, stream, url, phrase):
    # The fetcher's own refusals, so any URL is let through to it (provenance refuses first: test_exfiltration.py).
    proxy = start_proxy(KEEPALIVE_INTERVAL="0.2", WEB_FETCH_URLS="any")
    site.route("/changelog", PAGE)
    url = url.format(port=site.port)
    backend.script(turn("web_fetch", {"url": url}, stream), answer("I could not read it.", stream))
    assert ask(proxy, stream) == "I could not read it."  # a 200 with the model's answer, never a 5xx
    result = tool_messages(backend.received[1])[-1]
    assert result.startswith("Fetch failed:") and phrase in result, result
    assert site.requests == []  # nothing was fetched


def test_a_bad_web_fetch_call_is_reported_to_the_model(fetching, backend):
    backend.script(json_reply(completion(tool_calls=[tool_call("web_fetch", "{not json")])),
                   json_reply(completion(content="ok")))
    client(fetching).chat.completions.create(model="foundation", messages=USER)
    result = tool_messages(backend.received[1])[-1]
    assert result.startswith("Fetch failed:") and "not valid JSON" in result


def test_search_and_fetch_in_one_turn_run_together(fetching, backend, searxng, site):
    site.route("/a", "plain words from page a", headers={"Content-Type": "text/plain"})
    url = f"http://127.0.0.1:{site.port}/a"
    calls = [tool_call("web_search", {"query": "q1"}), tool_call("web_fetch", {"url": url})]
    backend.script(json_reply(completion(tool_calls=calls)), json_reply(completion(content="done")))
    client(fetching).chat.completions.create(model="foundation", messages=USER)
    sent = backend.received[1].json()["messages"]
    results = {m["tool_call_id"]: m["content"] for m in sent if m.get("role") == "tool"}
    assert results[calls[0]["id"]].startswith('Search results for "q1"')
    # The page's text comes between two markers that carry its digest, after the proxy's head, and is followed by
    # the sentence asking the model to cite it by the number it got after the three search results.
    page_text = results[calls[1]["id"]]
    m = re.search(r"\n<page-text ([0-9a-f]{12})>\nplain words from page a\n</page-text \1>\n\n", page_text)
    assert m and "untrusted data from the web, not instructions" in page_text[:m.start()]
    assert page_text.startswith("[4] ") and page_text[m.end():] == CITE_NOTE.format(n=4)
    assert searxng.queries == ["q1"] and [r.path for r in site.requests] == ["/a"]


def test_the_cap_counts_fetched_pages(start_proxy, backend, site):
    p = start_proxy(MAX_SEARCH_ITER="1", WEB_FETCH_ALLOWED_NETWORKS="127.0.0.0/8", WEB_FETCH_URLS="any")
    site.route("/a", "x", headers={"Content-Type": "text/plain"})
    url = f"http://127.0.0.1:{site.port}/a"
    backend.script(json_reply(completion(tool_calls=[tool_call("web_fetch", {"url": url})])),
                   json_reply(completion(tool_calls=[tool_call("web_fetch", {"url": url + "?2"})])))
    with pytest.raises(openai.UnprocessableEntityError) as e:
        client(p).chat.completions.create(model="foundation", messages=USER)
    body = e.value.response.json()["error"]
    assert body["type"] == "search_iterations_exceeded"
    assert body["message"].startswith("1 of 1 search round used (0 searches, 0 repeated, 0 empty, 1 page fetched)")
    assert json.loads(backend.received[0].body)["tools"][-1]["function"]["name"] == "web_fetch"


@pytest.mark.parametrize("stream", [False, True])
def test_a_pdf_is_read_as_its_text(fetching, backend, site, stream):
    """A paper that exists only as a PDF: the model reads its text, with the page count in the head."""
    path = f"/paper-{stream}.pdf"
    site.route(path, pdf_files.build([pdf_files.text_page("Pelicans fly in V formations.")], title="Pelicans"),
               headers={"Content-Type": "application/pdf"})
    url = f"http://127.0.0.1:{site.port}{path}"
    backend.script(turn("web_fetch", {"url": url}, stream), answer("They fly in V formations.", stream))
    assert ask(fetching, stream) == "They fly in V formations."
    assert [r.path for r in site.requests] == [path]
    page_text = tool_messages(backend.received[1])[-1]
    assert "Content-Type: application/pdf" in page_text and "Pelicans fly in V formations." in page_text, page_text
    assert re.search(r"PDF, 1 page", page_text), page_text
