"""Chat completions' wire: OpenAI's shape, vLLM's own (proxy/core/errors.py's Wire as it is). proxy/apis/wires.py
binds it to the route; not run on its own.
"""
from proxy.core.errors import Wire

WIRE = Wire("chat")
