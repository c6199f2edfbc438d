"""The train component (see README.md)."""
