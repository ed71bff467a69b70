"""The vocabulary every layer shares, importing no other layer: the settings (Config), the JSON and SSE codecs, the route table, the error bodies of each API, and type checks of a client's JSON."""
