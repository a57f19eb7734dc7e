"""One module per `chorus` subcommand; each defines `register(subparsers)` and sets `run`."""
