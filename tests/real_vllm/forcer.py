"""A vLLM logits processor for the real-vLLM tier (`--logits-processors forcer:ForceText`, test_tool_markup_real.py):
the random model writes the text in the file $FORCE_TEXT_FILE names, token for token, then ends its turn. It works
on every API, also /v1/messages, which takes no structured_outputs. The file is read as each request joins the batch;
an empty or missing file leaves the model alone."""
from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers import AutoTokenizer
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality


class ForceText(LogitsProcessor):
    def __init__(self, vllm_config, device, is_pin_memory):
        self.tokenizer = AutoTokenizer.from_pretrained(vllm_config.model_config.tokenizer)
        self.end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.path = Path(os.environ["FORCE_TEXT_FILE"])
        self.rows: dict[int, tuple[list[int], list[int]]] = {}

    @classmethod
    def validate_params(cls, sampling_params):
        return None

    def is_argmax_invariant(self) -> bool:
        return False

    def _script(self) -> list[int] | None:
        text = self.path.read_text() if self.path.exists() else ""
        return self.tokenizer.encode(text, add_special_tokens=False) + [self.end] if text else None

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, _params, _prompt, output in batch_update.added:
            script = self._script()
            if script is None:
                self.rows.pop(index, None)
            else:
                self.rows[index] = (script, output)
        for a, b, direction in batch_update.moved:
            row_a, row_b = self.rows.pop(a, None), self.rows.pop(b, None)
            if row_a is not None:
                self.rows[b] = row_a
            if row_b is not None and direction == MoveDirectionality.SWAP:
                self.rows[a] = row_b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, (script, output) in self.rows.items():
            target = script[len(output)] if len(output) < len(script) else self.end
            logits[index] = float("-inf")
            logits[index, target] = 0.0
        return logits
