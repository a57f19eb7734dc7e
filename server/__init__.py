"""The Chorus server.

Owns the network server (what `chorus serve` runs: conference-room device streams, Twilio
phone-bridge legs, Asterisk AudioSocket calls and SIP calls, the live event feed, the meeting-room
page (`page.html`: the room's microphone over the device protocol, the assistant's voice, the
transcript), health and metrics), the wire protocols, room tokens, server configuration, and the
client used by tests, examples and the load bench (`server.client`). Sits above models,
attribution, rooms, voice, diarization and realtime and
may import any of them; it imports neither `bench` nor `cli`. Importers: `cli` (the `chorus`
commands) and `bench` (the load bench drives a real server).

Shaped so: `app` keeps the sockets, tokens, limits and drain; each stream protocol is one module
(`device`, `twilio`, `audiosocket`, `sip`) that reads its framing into one
`framing.StreamDeclaration` plus audio, which `streaming` runs the same way for every protocol;
`live` is the room registry, `output` what the rooms say (turns, replies, speaker changes, STT and
diarization status), `renames` the page's renames and suggestions, `voices` the voice
directory (remembered voices named in every room, issue 27); `routes` the HTTP routes, `events`
the feed socket, `pipeline` the per-room speech pipeline; `overload` the pure policy for a diarization
stage that falls behind (stretch, fall back, refuse, recover), `stage_guard` what applies it to
live sessions (the pipeline's and a LiveKit job's), and `load` the load figure
`/healthz`, `/metrics` and `chorus agent` report.
"""
