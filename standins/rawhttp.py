"""A raw HTTP client for the tests: one request on a fresh connection, bytes as they are,
where the openai and anthropic SDKs would hide status details, headers or body bytes.

Imported by tests; not run on its own.
"""
import http.client
import urllib.parse


def raw_request(base_url, method, target, body=None, headers=None, timeout=30):
    """One request over a fresh connection: (status, lower-cased headers, body bytes)."""
    u = urllib.parse.urlsplit(base_url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        conn.putrequest(method, target, skip_accept_encoding=True)
        for k, v in (headers or {}).items():
            conn.putheader(k, v)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()
