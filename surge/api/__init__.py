"""The HTTP API: OpenAI-compatible endpoints, admin, health, metrics."""
