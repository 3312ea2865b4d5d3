"""`surge generate`: placeholder until the engine lands."""
