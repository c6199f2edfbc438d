"""The gather component (see README.md)."""
