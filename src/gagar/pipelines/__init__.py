"""The pipelines: the RL iteration (``rl``), grader SFT (``grader_sft``) and policy evaluation
(``evaluation``). The modules live in the checkout's top-level ``pipelines/``; the wheel maps them here."""

from gagar._checkout import checkout_folder

__path__ += checkout_folder("pipelines")
