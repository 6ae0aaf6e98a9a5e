"""A worker process: runners, its own slots and sessions, the step pipeline."""
