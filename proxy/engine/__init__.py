"""One client request's flow: the Exchange (its calls to vLLM on the client's watch, the byte-for-byte relay), the search loop every API shares, the events it emits, and the worker's Services."""
