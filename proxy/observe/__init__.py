"""Watching the proxy without being in its way: the Prometheus metrics, fed by the engine's events and by wrappers around the backends."""
