"""The `chorus` command line: the parser (`cli.main`) and one module per subcommand (`cli.commands`).

This package sits above everything else: its commands import `server` (serve, token, stream, agent),
`voice`/`diarization` (transcribe, diarize) and `bench` (bench), and nothing in the product imports
it back. Keeping the CLI here is what lets `bench` drive a real server (`bench.load` imports
`server`) without a cycle: `server` imports neither `bench` nor `cli`, and `bench` does not import
`cli` (it starts the server as `python -m cli.main serve`, a process, not an import).
"""
