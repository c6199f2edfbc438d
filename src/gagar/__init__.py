"""GAGAR: GRPO with grader-aware credit redistribution for code agents."""

__version__ = "0.1.0"
