"""Configs: the schema, its limits and grid, and the points it expands into (imports nothing above)."""
