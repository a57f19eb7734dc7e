"""AI providers for `AIChannel` (each implements `rooms.AIProvider`)."""
