"""Replicas of the public suite's workers, run beside sandboxd in one benchmark for a side-by-side figure."""
