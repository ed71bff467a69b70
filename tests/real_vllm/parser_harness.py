"""Runs in the vLLM venv (test_tool_markup_real.py): vLLM's qwen3_coder and the stack's qwen3_stack, each behind
the qwen3 reasoning parser as `vllm serve` composes them, on texts read as JSON from stdin, whole and streamed a
token at a time; prints what each gives (content, [[name, arguments]]) as one JSON line. Usage: python
parser_harness.py MODEL_DIR < texts.json"""
import json
import sys
from pathlib import Path

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser.abstract_parser import DelegatingParser
from vllm.reasoning import ReasoningParserManager
from vllm.tokenizers import get_tokenizer
from vllm.tool_parsers import ToolParserManager

ToolParserManager.import_tool_parser(str(Path(__file__).resolve().parents[2] / "vllm-plugin" / "qwen3_stack_parser.py"))
TOK = get_tokenizer(sys.argv[1])
TOOLS = [{"type": "function", "function": {"name": name, "parameters": {
    "type": "object", "properties": {key: {"type": "string"}}}}} for name, key in (("Grep", "query"), ("Bash", "command"))]
NO_THINKING = {"enable_thinking": False}


def parser(name: str):
    class Composed(DelegatingParser):
        reasoning_parser_cls = ReasoningParserManager.get_reasoning_parser("qwen3")
        tool_parser_cls = ToolParserManager.get_tool_parser(name)
    return Composed


def run(name: str, text: str, stream: bool) -> dict:
    req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], tools=TOOLS,
                                chat_template_kwargs=NO_THINKING)
    p = parser(name)(TOK, req.tools, chat_template_kwargs=NO_THINKING)
    req = p.adjust_request(req)
    if not stream:
        _, content, calls = p.parse(text, req, enable_auto_tools=True)
        return {"content": content, "calls": [[c.name, c.arguments] for c in calls or []]}
    ids = TOK.encode(text, add_special_tokens=False)
    content, found, prev = "", {}, ""
    for i, token in enumerate(ids):
        cur = TOK.decode(ids[:i + 1], skip_special_tokens=False)
        delta = p.parse_delta(cur[len(prev):], [token], req, prompt_token_ids=[], finished=i == len(ids) - 1)
        prev = cur
        if delta is None:
            continue
        content += delta.content or ""
        for tc in delta.tool_calls:
            entry = found.setdefault(tc.index, ["", ""])
            entry[0] += (tc.function and tc.function.name) or ""
            entry[1] += (tc.function and tc.function.arguments) or ""
    return {"content": content or None, "calls": [v for _, v in sorted(found.items())]}


texts = json.load(sys.stdin)
print(json.dumps([{mode: {name: run(name, text, mode == "stream") for name in ("qwen3_coder", "qwen3_stack")}
                   for mode in ("whole", "stream")} for text in texts]))
