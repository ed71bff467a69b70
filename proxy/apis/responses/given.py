"""What an OpenAI Responses request body gives web_fetch, pure (issue 33): its instructions, then its input items as
proxy/apis/given.py reads them (the same items Codex's /v1/alpha/search sends). Tested by tests/test_provenance.py.
"""
from __future__ import annotations

from proxy.apis.given import client_given, input_given
from proxy.core.codec import as_dict
from proxy.tools.provenance import Given


def given(body) -> list[Given]:
    """The request's instructions and input as Given parts, in order. Pure."""
    body = as_dict(body)
    return [*client_given("system", body.get("instructions")), *input_given(body.get("input"))]
