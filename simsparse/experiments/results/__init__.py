"""Results on disk: the store, provenance, metrics and trace formats (imports only config)."""
