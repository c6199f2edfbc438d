"""The prepare component (see README.md)."""
