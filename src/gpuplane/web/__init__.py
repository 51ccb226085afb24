"""Web edge: thin HTTP handlers over the public API."""
