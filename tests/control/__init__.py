"""Control-plane tests: surge serve end to end with the openai client."""
