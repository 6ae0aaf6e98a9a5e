"""Front processes: HTTP, the hot routes, the front door; every request sent where it is served."""
