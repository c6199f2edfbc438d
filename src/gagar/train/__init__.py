"""Training: the policy loss, checkpoints and resume (DESIGN.md §4).

Import the submodules (``gagar.train.loss``, ``gagar.train.checkpoint``) directly; they need the
``policy`` extra (torch).
"""
