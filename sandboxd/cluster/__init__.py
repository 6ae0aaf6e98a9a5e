"""Many nodes as one service: node registry and forwarding over Redis (``SANDBOXD_REDIS_URL``).

Without Redis none of this runs and a node is exactly the embedded default.
"""
