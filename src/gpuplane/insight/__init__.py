"""Pure analysis over plans and history: why a workload waits, queue position, ETA, usage, chargeback."""
