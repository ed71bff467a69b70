"""Per-delta cost of the tool-call and reasoning parsers inside vLLM (docs/apis.md, "Tool calls the model writes"):
vLLM's qwen3 + qwen3_coder, vLLM's qwen3 + the stack's qwen3_stack, and the stack's pair, each composed as
`vllm serve` composes them and fed one token at a time; the best of 5 rounds, the pairs interleaved in each round
(so a busy machine slows all three alike). Runs in the vLLM venv, like parser_harness.py:
python parser_bench.py MODEL_DIR"""
import sys
import time
from pathlib import Path

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser.abstract_parser import DelegatingParser
from vllm.reasoning import ReasoningParserManager
from vllm.tokenizers import get_tokenizer
from vllm.tool_parsers import ToolParserManager

PLUGIN = str(Path(__file__).resolve().parents[2] / "vllm-plugin" / "qwen3_stack_parser.py")
ToolParserManager.import_tool_parser(PLUGIN)
ReasoningParserManager.import_reasoning_parser(PLUGIN)
TOK = get_tokenizer(sys.argv[1])
TOOLS = [{"type": "function", "function": {"name": "Bash", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}}}}]
PROSE = "".join(f"Step {i}: if a < b and c<d then compare x<y; see <div> or a<=b. " for i in range(120))
BARE = "<function=Bash>\n<parameter=command>\necho " + "x" * 3595 + "\n</parameter>\n</function>"
CALL = f"<tool_call>\n{BARE}\n</tool_call>"
ANSWERS = {"answer only (thinking off)": (PROSE + "\n" + CALL, False),
           "reasoning, then the answer": ("<think>\n" + PROSE + "\n</think>\n\n" + CALL, True),
           "the call inside the reasoning": ("<think>\n" + PROSE + "\n" + BARE + "\n</think>\n\n", True)}
PAIRS = (("qwen3", "qwen3_coder"), ("qwen3", "qwen3_stack"), ("qwen3_stack", "qwen3_stack"))


def deltas(text: str) -> list[tuple[str, int]]:
    ids = TOK.encode(text, add_special_tokens=False)
    out, prev = [], ""
    for i in range(len(ids)):
        cur = TOK.decode(ids[:i + 1], skip_special_tokens=False)
        out.append((cur[len(prev):], ids[i]))
        prev = cur
    return out


def once(reasoning: str, tool: str, steps: list[tuple[str, int]], thinking: bool) -> float:
    kwargs = {"enable_thinking": thinking}

    class Composed(DelegatingParser):
        reasoning_parser_cls = ReasoningParserManager.get_reasoning_parser(reasoning)
        tool_parser_cls = ToolParserManager.get_tool_parser(tool)
    req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], tools=TOOLS,
                                chat_template_kwargs=kwargs)
    parser = Composed(TOK, req.tools, chat_template_kwargs=kwargs)
    req = parser.adjust_request(req)
    start = time.perf_counter()
    for i, (text, token) in enumerate(steps):
        parser.parse_delta(text, [token], req, prompt_token_ids=[], finished=i == len(steps) - 1)
    return (time.perf_counter() - start) / len(steps) * 1e6


for label, (answer, thinking) in ANSWERS.items():
    steps = deltas(answer)
    best = dict.fromkeys(PAIRS, float("inf"))
    for _ in range(5):
        for pair in PAIRS:
            best[pair] = min(best[pair], once(*pair, steps, thinking))
    print(f"{label}: {len(steps)} tokens")
    for (reasoning, tool), cost in best.items():
        print(f"  {reasoning:12} + {tool:12} {cost:7.1f} us per delta")
