"""Peers' own client code, verbatim, run against a real node (each directory says where it comes from)."""
