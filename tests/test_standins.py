"""The stand-ins are only as good as their fidelity: check the vLLM wire builders against
the real vLLM 0.32 captures in tests/data/vllm-0.32-samples/ (same keys, order and nulls).

Run: tests/run.sh tests/test_standins.py
"""
import json
from pathlib import Path

from standins.vllm_wire import completion, stream_frames, tool_call

SAMPLES = Path(__file__).parent / "data" / "vllm-0.32-samples"


def shape(obj):
    """Keys in order, recursively, with values reduced to their JSON type."""
    if isinstance(obj, dict):
        return {k: shape(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [shape(v) for v in obj[:1]]
    return type(obj).__name__


def test_completion_matches_the_capture():
    real = json.loads((SAMPLES / "chat-seed7-reasoning-then-content.json").read_text())
    ours = completion(content="a", reasoning="b", finish_reason="length", reasoning_tokens=6)
    assert list(ours) == list(real) and shape(ours) == shape(real)


def test_tool_call_completion_matches_the_capture():
    real = json.loads((SAMPLES / "forced-tool-call-nothink.json").read_text())
    ours = completion(tool_calls=[tool_call("web_search", {"query": "hello"})])
    assert shape(ours) == shape(real)
    assert ours["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == '{"query": "hello"}'


def frames_of(name):
    return [f + b"\n\n" for f in (SAMPLES / name).read_bytes().split(b"\n\n") if f.strip()]


def test_stream_matches_the_capture_frame_for_frame():
    real = frames_of("forced-tool-call-stream.sse")
    ours = stream_frames(tool_calls=[tool_call("web_search", {"query": "hello"})], include_usage=True, arg_pieces=3)
    assert len(ours) == len(real)
    for a, b in zip(ours, real, strict=True):
        assert a.startswith(b"data: ") and a.endswith(b"\n\n")
        if b == b"data: [DONE]\n\n":
            assert a == b
            continue
        assert shape(json.loads(a[6:])) == shape(json.loads(b[6:]))


def test_reasoning_stream_matches_the_capture():
    real = frames_of("stream-reasoning-then-content.sse")
    ours = stream_frames(reasoning=["x"], content=["y"])
    assert shape(json.loads(ours[0][6:])) == shape(json.loads(real[0][6:]))
    assert shape(json.loads(ours[1][6:])) == shape(json.loads(real[1][6:]))
    assert shape(json.loads(ours[2][6:])) == shape(json.loads(real[7][6:]))
