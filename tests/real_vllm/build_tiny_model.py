"""Builds the tiny random-weight Qwen3 model the real-vLLM tests serve; run by tests/real_vllm/setup.sh as `python build_tiny_model.py OUT_DIR` in the vLLM venv.

No weights can be downloaded here, so the model is made from scratch, seeded, so every build
is byte-identical and a seeded request gives the same text on every machine. It keeps only
what vLLM and the stack's parsers look at: the Qwen3 architecture, a byte-level BPE tokenizer
with Qwen's markup tokens, and a Qwen-style chat template.
"""
import json
import os
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEED = 1234

# Special tokens are stripped from output by vLLM (skip_special_tokens); the markup tokens are
# "added but not special", as in real Qwen3, so the reasoning and tool parsers see them in the
# text while each is still one token id that a logit_bias can raise.
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MARKUP = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
BPE_VOCAB = 2000

WORDS = (
    "the a of to and in is it you that for on with as are this be at or have from by not "
    "search web query result results answer question model server proxy stream token tool "
    "call function parameter hello world python code test file json value name time date "
    "weather news price open source fast slow small large first last next page link title "
    "content snippet url http https www com org example think reason because so then if else"
).split()


def corpus(rng: random.Random) -> list[str]:
    """About 4k lines shaped like what the tests send and force: chat markup, JSON, prose."""
    lines = []
    for i in range(4000):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 14)))
        kind = i % 5
        if kind == 0:
            lines.append(f"<|im_start|>user\n{words.capitalize()}?<|im_end|>")
        elif kind == 1:
            lines.append(f"<|im_start|>assistant\n<think>\n{words}.\n</think>\n\n{words.capitalize()}.<|im_end|>")
        elif kind == 2:
            lines.append(
                "<tool_call>\n<function=web_search>\n<parameter=query>\n"
                f"{words}\n</parameter>\n</function>\n</tool_call>"
            )
        elif kind == 3:
            obj = {"title": words.title(), "url": f"https://example.com/{rng.randint(0, 999)}", "content": words}
            lines.append(json.dumps(obj))
        else:
            lines.append(f"{words.capitalize()}, {rng.randint(0, 10**6)} {rng.choice(WORDS)}.")
    return lines


def build_tokenizer(out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(random.Random(SEED)), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=131072,
    )
    fast.add_tokens(MARKUP, special_tokens=False)
    fast.chat_template = (HERE / "chat_template.jinja").read_text()
    fast.save_pretrained(out)
    return fast


def build_model(out: Path, vocab_size: int, eos_id: int, pad_id: int) -> None:
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(SEED)
    cfg = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        # vLLM's CPU attention backend rejects head sizes under 32.
        head_dim=32,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    # A larger init than the default 0.02 so sampled text varies visibly with the seed
    # instead of collapsing to near-uniform logits.
    cfg.initializer_range = 0.2
    model = Qwen3ForCausalLM(cfg).to(torch.float32).eval()
    model.save_pretrained(out, safe_serialization=True)
    # Only the stop token: any sampling defaults here would silently become vLLM's defaults.
    GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id).save_pretrained(out)


def main() -> int:
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar for one 1 MB shard is noise in setup's progress
    fast = build_tokenizer(out)
    ids = fast.convert_tokens_to_ids(MARKUP + SPECIAL)
    assert len(set(ids)) == len(ids) and fast.unk_token_id not in ids, ids
    build_model(out, len(fast), fast.eos_token_id, fast.pad_token_id)
    print(f"tiny model: vocab {len(fast)}, eos {fast.eos_token_id}, written to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
