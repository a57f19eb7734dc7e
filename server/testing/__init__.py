"""Test tools for the server that ship with it (tests, the demo and the load bench use them):
`server.testing.harness` starts a real `ChorusServer` on a free loopback port in-process, with its
STT on the local Deepgram-protocol server when asked, and has the small helpers a test needs
around it (an HTTP GET, audio read so far, a `/metrics` value, `eventually`, a test tone)."""
