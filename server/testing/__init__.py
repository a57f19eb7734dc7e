"""Test tools for the server that ship with it: a headless Chromium driven over the DevTools
protocol (for the transcript page). Imports nothing but the standard library and websockets."""
