"""The Chorus server.

Owns the network server (what `chorus serve` runs: conference-room device streams, Twilio phone-
bridge legs, Asterisk AudioSocket and SIP calls, the live event feed and transcript page, health
and metrics), the wire protocols, room tokens, server configuration, and the client used by
tests, examples and the load bench (`server.client`). Sits above models, attribution, rooms,
voice, diarization and realtime and may import any of them; it imports neither `bench` nor
`cli`. Importers: `cli` (the `chorus` commands) and `bench` (the load bench drives a real
server).

Shaped so: `app` keeps the sockets, tokens, limits and drain; each stream protocol is one module
(`device`, `twilio`, `audiosocket`, `sip`) that reads its framing into one
`framing.StreamDeclaration` plus audio, which `streaming` runs the same way for every protocol;
`live` is the room registry, `output` what the rooms say (turns, replies, speaker changes, STT
status), `renames` the page's renames; `routes` the HTTP routes, `events` the feed socket,
`pipeline` the per-room speech pipeline.
"""
