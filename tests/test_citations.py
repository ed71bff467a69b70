"""Answers that cite their sources (issue 29): the pure rules of proxy/apis/citations.py (numbering, markers found whole
and across a stream's deltas), then the real proxy under gunicorn with the scripted vLLM stand-in making the model
write [n] markers, read back through the official anthropic and openai SDKs' typed objects, plain and streamed, and
checked strictly against their types; replayed history with citations, and CITATIONS=off.

Run: tests/run.sh tests/test_citations.py -q
"""
from __future__ import annotations

import json

import pytest
from clients import anthropic, openai
from test_sdk_types import post, sse_data, strict, strict_event

from proxy.apis import citations as C
from proxy.backends.search.search import Hit, SearchOutcome
from proxy.tools import sources as S
from proxy.tools.web_search import format_for_model
from standins import anthropic_wire as W
from standins import responses_wire as w
from standins.searxng import default_results
from standins.vllm_wire import completion, json_reply, sse_reply, stream_frames, tool_call

SEARCH = {"type": "web_search_20250305", "name": "web_search"}
HOSTED = {"type": "web_search"}
ASK = [{"role": "user", "content": "What changed in vLLM 0.32?"}]
URLS = [r["url"] for r in default_results("vllm 0.32")]  # what the SearXNG stand-in answers, numbered [1]..[3]
PAGE_TEXT = "vLLM 0.32 adds a CPU backend. It also drops Python 3.9."


# ---- pure rules --------------------------------------------------------------------------------

def hits(*urls) -> SearchOutcome:
    return SearchOutcome("q", "ok", hits=[Hit(f"T {u}", u, f"snippet of {u}") for u in urls])


def test_one_counter_over_a_requests_searches_and_a_url_keeps_its_number():
    s = S.Sources()
    first = S.numbered(s, hits("https://a", "https://b"), format_for_model(hits("https://a", "https://b")))
    second = S.numbered(s, hits("https://c", "https://a"), format_for_model(hits("https://c", "https://a")))
    assert "[1] T https://a" in first and "[2] T https://b" in first and first.endswith(S.CITE_NOTE.format(n=1))
    assert "[3] T https://c" in second and "[1] T https://a" in second and "[2]" not in second
    assert [s.get(n).url for n in (1, 2, 3)] == ["https://a", "https://b", "https://c"]


def test_results_in_another_layout_get_their_numbers_listed():
    s = S.Sources()
    text = S.numbered(s, hits("https://a"), "Result: https://a")
    assert text == "Result: https://a\n\n[1] https://a\n\n" + S.CITE_NOTE.format(n=1)


def test_citations_off_leaves_the_text_as_it_was():
    assert S.numbered(None, hits("https://a"), "as formatted") == "as formatted"


@pytest.mark.parametrize("text,found", [
    ("plain [1].", [(6, 9, (1,))]),
    ("two [1][2]", [(4, 7, (1,)), (7, 10, (2,))]),
    ("a list [1, 3]", [(7, 13, (1, 3))]),
    ("a year [2026] and a link [x](y)", []),
    ("unclosed [1", []),
])
def test_markers(text, found):
    assert [(m.start, m.end, m.numbers) for m in C.find_markers(text)] == found


@pytest.mark.parametrize("pieces", [
    ["It shipped [1]. Then [2, 3] and [9]. End [4"],
    ["It shipped [", "1", "]. Then [2,", " 3] and [9]. End [4"],
    list("It shipped [1]. Then [2, 3] and [9]. End [4"),
    ["It shipped [1", "]. Then [2, 3", "] and [9]. End [", "4"],
])
def test_scanner_finds_what_the_whole_text_holds_and_holds_back_only_a_partial_marker(pieces):
    scanner = C.MarkerScanner()
    found = []
    for p in pieces:
        found += scanner.feed(p)
        assert len(scanner.held) <= 16 and (not scanner.held or scanner.held.startswith("["))
    assert found == C.find_markers("".join(pieces))
    assert scanner.held == "[4"


def test_a_marker_naming_no_source_cites_nothing():
    s = S.Sources()
    S.numbered(s, hits("https://a"), format_for_model(hits("https://a")))
    assert C.cite_text("see [1] and [7]", s, C.url_citation) == [
        {"type": "url_citation", "url": "https://a", "title": "T https://a", "start_index": 4, "end_index": 7}]


def test_char_location_cites_the_sentence_the_claim_came_from():
    s = S.Sources()
    S.Sources.number_document(s, "https://p", "P", PAGE_TEXT, "page")
    [c] = C.cite_text("Python 3.9 is dropped [1].", s, C.anthropic_shape(True))
    assert c["cited_text"] == "It also drops Python 3.9." == PAGE_TEXT[c["start_char_index"]:c["end_char_index"]]
    assert C.cite_text("x [1]", s, C.anthropic_shape(False)) == []  # web_fetch without citations enabled


# ---- through the proxy ---------------------------------------------------------------------------

def messages_search(backend, stream: bool, answer: list[str]):
    reply = W.stream_reply if stream else W.message_reply
    backend.script(reply([W.tool_use("web_search", {"query": "vllm 0.32"})]), reply([W.text(answer)]))


def anthropic_answer(proxy, stream: bool, **kw):
    c = anthropic.Anthropic(base_url=proxy.url, api_key="k", max_retries=0, timeout=30)
    kw = {"model": "foundation", "max_tokens": 99, "messages": ASK, **kw}
    if stream:
        with c.messages.stream(**kw) as s:
            return s.get_final_message()
    return c.messages.create(**kw)


@pytest.mark.parametrize("stream", [False, True])
def test_messages_text_blocks_cite_search_results(proxy, backend, searxng, stream):
    answer = ["vLLM 0.32 adds things [", "2]. It is fast [7]."]  # the marker split across two deltas
    messages_search(backend, stream, answer)
    msg = anthropic_answer(proxy, stream, tools=[SEARCH])
    text = msg.content[-1]
    assert text.text == "".join(answer)  # markers stay: Anthropic's citations carry no place in the text
    assert [(c.type, c.url, c.title, c.cited_text) for c in text.citations] == [
        ("web_search_result_location", URLS[1], "vllm 0.32 — result 2", "Snippet 2 about vllm 0.32.")]
    assert text.citations[0].encrypted_index
    strict(anthropic.types.Message, msg.model_dump(exclude_unset=True))
    # What the model read: the results numbered, and asked to cite them.
    result = backend.received[1].json()["messages"][-1]["content"][0]["content"]
    assert "[1] vllm 0.32 — result 1" in result and result.endswith(S.CITE_NOTE.format(n=1))


def test_messages_stream_sends_citations_delta_inside_the_text_block(proxy, backend, searxng):
    messages_search(backend, True, ["Things [", "1] and [3]", "."])
    raw = post(proxy, "/v1/messages", {"model": "foundation", "max_tokens": 9, "messages": ASK, "tools": [SEARCH],
                                       "stream": True})
    events = [e for e in sse_data(raw) if e["type"] != "ping"]
    for e in events:
        strict_event(anthropic.types.RawMessageStreamEvent, e)
    text_index = next(e["index"] for e in events if e["type"] == "content_block_start" and e["content_block"]["type"] == "text")
    deltas = [(e["delta"]["type"], e["delta"].get("text") or e["delta"].get("citation", {}).get("url"))
              for e in events if e["type"] == "content_block_delta" and e["index"] == text_index]
    assert deltas == [("text_delta", "Things ["), ("text_delta", "1] and [3]"), ("citations_delta", URLS[0]),
                      ("citations_delta", URLS[2]), ("text_delta", ".")]


@pytest.mark.parametrize("enabled", [True, False])
@pytest.mark.parametrize("stream", [False, True])
def test_messages_fetch_cites_character_ranges_only_when_enabled(start_proxy, backend, site, stream, enabled):
    site.route("/p", PAGE_TEXT, headers={"Content-Type": "text/plain"})
    proxy = start_proxy(WEB_FETCH_ALLOWED_NETWORKS="127.0.0.0/8", WEB_FETCH_URLS="any")
    reply = W.stream_reply if stream else W.message_reply
    url = f"http://127.0.0.1:{site.port}/p"
    backend.script(reply([W.tool_use("web_fetch", {"url": url})]), reply([W.text(["Python 3.9 is ", "gone [1]."])]))
    tool = {"type": "web_fetch_20250910", "name": "web_fetch", "citations": {"enabled": enabled}}
    msg = anthropic_answer(proxy, stream, tools=[tool])
    strict(anthropic.types.Message, msg.model_dump(exclude_unset=True))
    text = msg.content[-1]
    result = backend.received[1].json()["messages"][-1]["content"][0]["content"]
    if not enabled:  # as at Anthropic: no citations, and the page is not numbered for the model
        assert not text.citations and not result.startswith("[1]")
        return
    [c] = text.citations
    assert (c.type, c.document_index, c.cited_text) == ("char_location", 0, "It also drops Python 3.9.")
    assert PAGE_TEXT[c.start_char_index:c.end_char_index] == c.cited_text
    assert result.startswith(f"[1] Page {url}")


@pytest.mark.parametrize("stream", [False, True])
def test_responses_output_text_carries_url_citations(proxy, backend, searxng, stream):
    text = "It shipped [3], fast [1, 2]. Not [8]."
    pieces = ["It shipped [", "3], fast [1,", " 2]. Not [8]."]
    backend.responder = w.model([w.call("web_search", {"query": "vllm 0.32"})], [w.message(pieces)])
    kw = {"model": "foundation", "input": "What changed?", "tools": [HOSTED]}
    c = openai.OpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=0, timeout=30)
    if stream:
        with c.responses.stream(**kw) as s:
            events = list(s)
            resp = s.get_final_response()
        added = [e for e in events if e.type == "response.output_text.annotation.added"]
        assert [(e.annotation_index, e.annotation.url) for e in added] == [(0, URLS[2]), (1, URLS[0]), (2, URLS[1])]
    else:
        resp = c.responses.create(**kw)
    strict(openai.types.responses.Response, resp.model_dump(exclude_unset=True))
    part = resp.output[-1].content[0]
    assert part.text == text  # markers stay: each annotation's range is its marker
    assert [(a.url, text[a.start_index:a.end_index]) for a in part.annotations] == [
        (URLS[2], "[3]"), (URLS[0], "[1, 2]"), (URLS[1], "[1, 2]")]
    assert part.annotations[0].title == "vllm 0.32 — result 3"


def test_responses_stream_done_events_and_final_response_agree(proxy, backend, searxng):
    backend.responder = w.model([w.call("web_search", {"query": "vllm 0.32"})], [w.message(["A [", "1]."])])
    events = sse_data(post(proxy, "/v1/responses", {"model": "foundation", "input": "hi", "tools": [HOSTED], "stream": True}))
    for e in events:
        strict_event(openai.types.responses.ResponseStreamEvent, e)
    want = [{"type": "url_citation", "url": URLS[0], "title": "vllm 0.32 — result 1", "start_index": 2, "end_index": 5}]
    part_done = next(e for e in events if e["type"] == "response.content_part.done")
    item_done = [e for e in events if e["type"] == "response.output_item.done"][-1]
    assert part_done["part"]["annotations"] == item_done["item"]["content"][0]["annotations"] == want
    assert events[-1]["response"]["output"][-1]["content"][0]["annotations"] == want


@pytest.mark.parametrize("stream", [False, True])
def test_chat_message_annotations(proxy, backend, searxng, stream):
    calls = [tool_call("web_search", {"query": "vllm 0.32"})]
    c = openai.OpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=0, timeout=30)
    kw = {"model": "foundation", "messages": ASK}
    if stream:
        backend.script(sse_reply(stream_frames(tool_calls=calls)), sse_reply(stream_frames(content=["Fast [", "2]."])))
        with c.chat.completions.stream(**kw) as s:
            chunks = [e.chunk for e in s if e.type == "chunk"]
            done = s.get_final_completion()
        for ch in chunks:
            strict(openai.types.chat.ChatCompletionChunk, ch.model_dump(exclude_unset=True))
        # The annotations ride on one chunk's delta, just before the finish chunk.
        last = [ch for ch in chunks if ch.choices]
        assert getattr(last[-2].choices[0].delta, "annotations", None) and last[-1].choices[0].finish_reason == "stop"
    else:
        backend.script(json_reply(completion(tool_calls=calls)), json_reply(completion(content="Fast [2].")))
        done = c.chat.completions.create(**kw)
        strict(openai.types.chat.ChatCompletion, done.model_dump(exclude_unset=True))
    message = done.choices[0].message
    assert message.content == "Fast [2]."
    [a] = message.annotations
    assert (a.type, a.url_citation.url, message.content[a.url_citation.start_index:a.url_citation.end_index]) == \
           ("url_citation", URLS[1], "[2]")


@pytest.mark.parametrize("stream", [False, True])
def test_citations_off(start_proxy, backend, searxng, stream):
    proxy = start_proxy(CITATIONS="off")
    messages_search(backend, stream, ["Things [1]."])
    msg = anthropic_answer(proxy, stream, tools=[SEARCH])
    assert msg.content[-1].text == "Things [1]." and not msg.content[-1].citations
    result = backend.received[1].json()["messages"][-1]["content"][0]["content"]
    assert result == format_for_model(SearchOutcome("vllm 0.32", "ok", hits=[
        Hit(r["title"], r["url"], r["content"], r["publishedDate"][:10] if r["publishedDate"] else None)
        for r in default_results("vllm 0.32")]))


# ---- replayed history -----------------------------------------------------------------------------

def test_replayed_anthropic_citations_do_not_reach_vllm(proxy, backend, searxng):
    messages_search(backend, False, ["Things [1]."])
    first = anthropic_answer(proxy, False, tools=[SEARCH])
    assert first.content[-1].citations
    history = ASK + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                     {"role": "user", "content": "more?"}]
    backend.reset()
    backend.script(W.message_reply([W.text("More.")]))
    again = anthropic_answer(proxy, False, tools=[SEARCH], messages=history)
    assert again.content[-1].text == "More."
    sent = json.dumps(backend.received[0].json()["messages"], ensure_ascii=False)
    assert "citations" not in sent and "Things [1]." in sent
    # The model reads the replayed results numbered as it read them the first time.
    assert "[1] vllm 0.32 — result 1" in sent


def test_replayed_responses_annotations_and_chat_annotations_are_stripped(proxy, backend, searxng):
    note = {"type": "url_citation", "url": URLS[0], "title": "t", "start_index": 7, "end_index": 10}
    backend.responder = w.model([w.message("Fine.")])
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q"}]},
             {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
              "content": [{"type": "output_text", "text": "Things [1].", "annotations": [note]}]},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "more?"}]}]
    post(proxy, "/v1/responses", {"model": "foundation", "input": items, "tools": [HOSTED]})
    sent = [r.json() for r in backend.received if r.path == "/v1/responses"][0]["input"]
    assert sent[1]["content"][0] == {"type": "output_text", "text": "Things [1].", "annotations": []}
    backend.reset()
    backend.script(json_reply(completion(content="Fine.")))
    chat = [{"role": "user", "content": "q"},
            {"role": "assistant", "content": "Things [1].", "annotations": [{"type": "url_citation", "url_citation": note}]},
            {"role": "user", "content": "more?"}]
    post(proxy, "/v1/chat/completions", {"model": "foundation", "messages": chat})
    assert backend.received[0].json()["messages"][1] == {"role": "assistant", "content": "Things [1]."}
