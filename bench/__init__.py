"""Benchmarks: the code behind `chorus bench NAME`.

Each module `bench/<name>.py` exposes `add_arguments(parser)` and `run(args) -> int`; the CLI finds
them by name, so a benchmark is one module. Benchmarks print a table (with a progress bar while they
run) and write JSON; figures go into docs/benchmarks.md together with the command that made them.

Benchmarks may import every product package (`bench.load` imports `server`) but never `cli`, which
sits above them (`cli.commands.bench` imports this package); the load bench starts a server as a
process (`python -m cli.main serve`), not by importing the CLI.
"""
