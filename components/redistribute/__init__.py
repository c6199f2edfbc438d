"""The redistribute component (see README.md)."""
