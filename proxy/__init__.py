"""The proxy behind proxy-passthrough.py: one module per API over a shared search core."""
