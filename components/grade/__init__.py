"""The grader component (see README.md)."""
