"""Benchmarks: the code behind `chorus bench NAME`.

Each module `bench/<name>.py` exposes `add_arguments(parser)` and `run(args) -> int`; the CLI finds
them by name, so a benchmark is one module. Benchmarks print a table (with a progress bar while they
run) and write JSON; figures go into docs/benchmarks.md together with the command that made them.
"""
