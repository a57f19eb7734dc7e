"""The Chorus server.

Owns the network server (what `chorus serve` runs: conference-room device streams, Twilio
phone-bridge legs, the live event feed and transcript page, health and metrics), the wire
protocols, room tokens, server configuration, and the client used by tests, examples and the load
bench (`server.client`). Sits above models, attribution, rooms, voice, diarization and realtime and
may import any of them; it imports neither `bench` nor `cli`. Importers: `cli` (the `chorus`
commands) and `bench` (the load bench drives a real server).
"""
