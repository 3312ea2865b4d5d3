"""surge: serverless LLM serving that scales out in under a second and serves while loading."""

__version__ = "0.1.0"
