"""Test doubles that speak real wire formats (a local Deepgram server). Imported by tests and
benchmarks only; never by the runtime."""
