"""The Kubernetes client wrapper that every driver talking to a cluster shares (a layer of its own,
below the drivers: see .importlinter)."""
