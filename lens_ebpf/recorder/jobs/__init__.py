"""The recorder's periodic jobs, each run by core/runner."""
