"""The policy: agent format, tokenizer and model, SFT to the pre-RL checkpoint, generation, rollout.

Modules (import what you need; heavy dependencies load with them):

- :mod:`~gagar.policy.agent_format`: single-turn prompt and SEARCH/REPLACE answers
- :mod:`~gagar.policy.tool_loop`: multi-turn tool loop (view, search, edit, run tests, submit)
- :mod:`~gagar.schema.trajectory`: the Trajectory record and sampling parameters
- :mod:`~gagar.policy.tokenizer`, :mod:`~gagar.policy.model`: the embedded tiny default, HF format
- :mod:`~gagar.policy.demos`, :mod:`~gagar.policy.sft`: demonstrations and supervised fine-tuning
- :mod:`~gagar.policy.generation` (HF), :mod:`~gagar.policy.openai_backend`,
  :mod:`~gagar.policy.vllm_backend`: generation backends; :mod:`~gagar.policy.server`: a local endpoint
- :mod:`~gagar.policy.rollout`, :mod:`~gagar.policy.evaluate`: trajectories and their quality
"""
