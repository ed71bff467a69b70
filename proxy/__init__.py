"""The proxy behind proxy-passthrough.py, in layers that each import only the ones below them (docs/architecture.md):
http, observe, apis, engine, tools, backends, transport, runtime, core."""
