"""The Chorus server and command line.

Owns the network server (`chorus serve`: conference-room device streams, Twilio phone-bridge
legs, the live event feed and transcript page, health and metrics), the wire protocols, room
tokens, server configuration, and the `chorus` CLI. Sits on top of everything and may import
every other package (models, attribution, rooms, voice, diarization, realtime); nothing imports it.
"""
