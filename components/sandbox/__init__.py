"""The sandbox component (see README.md)."""
