"""The repository's scripts, as a package so that those sharing the test harness (standins/) run as modules from the
repository root, e.g. `python -m scripts.load_test`, which puts the root (and so standins/ and proxy/) on the path."""
