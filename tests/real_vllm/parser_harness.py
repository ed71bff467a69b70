"""Runs in the vLLM venv (test_tool_markup_real.py): vLLM's qwen3_coder behind its qwen3 reasoning parser, and the
stack's qwen3_stack behind the stack's qwen3_stack reasoning parser, each pair composed as `vllm serve` composes them,
on texts read as JSON from stdin, whole and streamed a token at a time, with the tools of
tests/data/qwen3-tool-markup.json; prints what each gives (reasoning, content, [[name, arguments]]) as one JSON line.
Usage: python parser_harness.py MODEL_DIR [--thinking] < texts.json"""
import json
import sys
from pathlib import Path

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser.abstract_parser import DelegatingParser
from vllm.reasoning import ReasoningParserManager
from vllm.tokenizers import get_tokenizer
from vllm.tool_parsers import ToolParserManager

REPO = Path(__file__).resolve().parents[2]
PLUGIN = str(REPO / "vllm-plugin" / "qwen3_stack_parser.py")
ToolParserManager.import_tool_parser(PLUGIN)
ReasoningParserManager.import_reasoning_parser(PLUGIN)
TOK = get_tokenizer(sys.argv[1])
SCHEMAS = json.loads((REPO / "tests" / "data" / "qwen3-tool-markup.json").read_text())["schemas"]
TOOLS = [{"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": properties}}}
         for name, properties in SCHEMAS.items()]
KWARGS = {"enable_thinking": "--thinking" in sys.argv}
REASONING = {"qwen3_coder": "qwen3", "qwen3_stack": "qwen3_stack"}


def parser(name: str):
    class Composed(DelegatingParser):
        reasoning_parser_cls = ReasoningParserManager.get_reasoning_parser(REASONING[name])
        tool_parser_cls = ToolParserManager.get_tool_parser(name)
    return Composed


def run(name: str, text: str, stream: bool) -> dict:
    req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], tools=TOOLS,
                                chat_template_kwargs=KWARGS)
    p = parser(name)(TOK, req.tools, chat_template_kwargs=KWARGS)
    req = p.adjust_request(req)
    if not stream:
        reasoning, content, calls = p.parse(text, req, enable_auto_tools=True)
        return {"reasoning": reasoning, "content": content, "calls": [[c.name, c.arguments] for c in calls or []]}
    ids = TOK.encode(text, add_special_tokens=False)
    reasoning, content, found, prev = "", "", {}, ""
    for i, token in enumerate(ids):
        cur = TOK.decode(ids[:i + 1], skip_special_tokens=False)
        delta = p.parse_delta(cur[len(prev):], [token], req, prompt_token_ids=[], finished=i == len(ids) - 1)
        prev = cur
        if delta is None:
            continue
        reasoning += delta.reasoning or ""
        content += delta.content or ""
        for tc in delta.tool_calls:
            entry = found.setdefault(tc.index, ["", ""])
            entry[0] += (tc.function and tc.function.name) or ""
            entry[1] += (tc.function and tc.function.arguments) or ""
    return {"reasoning": reasoning or None, "content": content or None, "calls": [v for _, v in sorted(found.items())]}


texts = json.load(sys.stdin)
print(json.dumps([{mode: {name: run(name, text, mode == "stream") for name in ("qwen3_coder", "qwen3_stack")}
                   for mode in ("whole", "stream")} for text in texts]))
