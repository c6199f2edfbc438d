"""The select component (see README.md)."""
