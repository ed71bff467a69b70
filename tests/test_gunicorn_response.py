"""proxy/http/gunicorn_response.py: which writes reach the client socket for each kind of answer.

Run: tests/run.sh tests/test_gunicorn_response.py
"""
from types import SimpleNamespace

import pytest
from gunicorn.http import wsgi

from proxy.http.gunicorn_response import JOIN_LIMIT, OneWriteResponse


class RecordingSocket:
    def __init__(self):
        self.writes = []

    def sendall(self, data):
        self.writes.append(bytes(data))

    # The write timeout and send buffer OneWriteResponse sets on a real socket (tests/test_team.py plays them).
    def settimeout(self, _seconds):
        pass

    def gettimeout(self):
        return None

    def setsockopt(self, *_args):
        pass


def answer(method, status, headers, pieces, cls=OneWriteResponse):
    """Run one response through gunicorn's write path as its worker does: the writes it made."""
    req = SimpleNamespace(version=(1, 1), method=method, should_close=lambda: False)
    sock = RecordingSocket()
    resp = cls(req, sock, SimpleNamespace(protocol="http", is_ssl=False))
    resp.start_response(status, headers)
    for piece in pieces:
        resp.write(piece)
    resp.close()
    return sock.writes


def head_of(writes):
    return writes[0].split(b"\r\n\r\n", 1)[0]


SSE = [("Content-Type", "text/event-stream")]
EV1, EV2 = b"data: {\"a\":1}\n\n", b"data: [DONE]\n\n"


@pytest.mark.parametrize("method, status, headers, pieces, bodies", [
    # a stream: the head and the first event in one write, then one write per piece, then the end
    ("POST", "200 OK", SSE, [EV1, EV2], [b"F\r\n" + EV1 + b"\r\n", b"E\r\n" + EV2 + b"\r\n", b"0\r\n\r\n"]),
    # an empty piece first: the head goes out at once, as gunicorn would send it
    ("POST", "200 OK", SSE, [b"", EV1], [b"", b"F\r\n" + EV1 + b"\r\n", b"0\r\n\r\n"]),
    # a whole JSON answer: one write in all
    ("POST", "200 OK", [("Content-Length", "2")], [b"{}"], [b"{}"]),
    # no body at all: the head leaves when the response closes
    ("POST", "200 OK", [("Content-Length", "0")], [], [b""]),
    ("HEAD", "200 OK", [("Content-Length", "2")], [], [b""]),
    ("GET", "204 No Content", [], [], [b""]),
    # a body too big to be worth a join: head, then body, no copy
    ("POST", "200 OK", [("Content-Length", str(JOIN_LIMIT + 1))], [b"x" * (JOIN_LIMIT + 1)], [b"", b"x" * (JOIN_LIMIT + 1)]),
])
def test_writes(method, status, headers, pieces, bodies):
    writes = answer(method, status, headers, pieces)
    assert head_of(writes).startswith(b"HTTP/1.1 " + status.encode())
    assert [writes[0].split(b"\r\n\r\n", 1)[1]] + writes[1:] == bodies


@pytest.mark.parametrize("method, status, headers, pieces, saved", [
    ("POST", "200 OK", SSE, [EV1, EV2], 1),
    ("POST", "200 OK", SSE, [b"", EV1], 0),
    ("POST", "200 OK", [("Content-Length", "2")], [b"{}"], 1),
    ("HEAD", "200 OK", [("Content-Length", "2")], [], 0),
    ("GET", "204 No Content", [], [], 0),
])
def test_same_bytes_as_gunicorn(method, status, headers, pieces, saved):
    """Only the grouping into writes differs from gunicorn's own Response."""
    def without_date(writes):
        data = b"".join(writes)
        start = data.index(b"\r\nDate: ")
        return data[:start] + data[data.index(b"\r\n", start + 2):]
    ours = answer(method, status, headers, pieces)
    theirs = answer(method, status, headers, pieces, cls=wsgi.Response)
    assert without_date(ours) == without_date(theirs)
    assert len(theirs) - len(ours) == saved
