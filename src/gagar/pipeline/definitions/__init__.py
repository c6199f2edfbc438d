"""The pipelines: the RL iteration (rl), grader SFT (grader_sft) and policy evaluation (evaluation)."""
