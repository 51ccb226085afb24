"""Metrics edge: exposes scheduler and usage metrics for Prometheus to scrape."""
