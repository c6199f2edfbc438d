"""The grader_sft component (see README.md)."""
