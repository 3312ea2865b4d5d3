"""Request traces for the simulator: real traces and synthetic generators.

Out of every loader comes one `Trace` (numpy columns: arrival second, prompt tokens,
output tokens, model index). `resolve.load_trace` turns a name or a file path into a
trace; `transform` slices time windows, scales rates, maps requests to models and clips
to a context length. Nothing here fetches data: real traces are read from
`<repo>/../shared/traces` (or a directory given by the user).
"""
