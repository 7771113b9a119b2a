"""Training progress from the pods' logs, the workload timeline, and the rank that holds
the others back."""
