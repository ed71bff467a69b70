"""The client-facing APIs, a sub-package each with the same file roles (handler: the HTTP handler and the loop's dialects; pure rules beside it), and the citations they share."""
