"""The evaluate component (see README.md)."""
