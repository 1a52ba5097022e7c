"""The OpenAI-compatible HTTP server, one concern per module (see docs/server.md)."""
