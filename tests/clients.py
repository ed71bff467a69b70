"""The official openai and anthropic clients for the tests, imported on first use: `from clients import anthropic, openai`.

Importing anthropic costs about 3 s of CPU (thousands of pydantic models) and openai about 1 s, and every pytest
process imports every test module (tests/run.sh's selection, each -n worker), most of which never touch a client.
Each name here stands for its package and imports it at the first public attribute read (`anthropic.Anthropic`).
Private and dunder names are not forwarded: pytest reads those (fixture markers, `__test__`) from every module-level
object while it collects, and that alone must not import the package (importlib's LazyLoader would).
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class OnFirstUse(ModuleType):
    def __getattr__(self, attr: str) -> Any:  # only for names the stand-in itself lacks: all public ones
        if attr.startswith("_"):
            raise AttributeError(attr)
        return getattr(importlib.import_module(self.__name__), attr)


anthropic = OnFirstUse("anthropic")
openai = OnFirstUse("openai")
