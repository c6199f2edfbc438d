"""The rollout component (see README.md)."""
