"""Command-line edge: argument parsing and output formatting over the public API."""
