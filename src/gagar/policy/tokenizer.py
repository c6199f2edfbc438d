"""The embedded default tokenizer: a byte-level BPE trained offline on code with ``tokenizers``.

Saved as ``tokenizer.json`` (plus ``tokenizer_config.json``) by ``save_pretrained``, so it loads
with ``transformers.AutoTokenizer.from_pretrained(DIR)`` exactly like a real checkpoint's tokenizer.
It pre-tokenizes as Qwen2 does, because that is how a policy directory's tokenizer is loaded again
(:data:`QWEN2_PRETOKENIZE_REGEX`), and its chat template is Qwen's ChatML, so prompts are built the
same way for the tiny model and for Qwen2.5-Coder.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

# A saved policy directory has a ``qwen2`` config, so ``AutoTokenizer`` (transformers 5) and vLLM load
# its tokenizer as ``Qwen2Tokenizer``, which rebuilds the NFC normalizer and Qwen2's regex pre-tokenizer
# (single digits; newlines apart from the next line's indentation) around the saved vocabulary and
# merges. Training with the very same pattern keeps the text the model learned on segmented exactly as
# the text it later reads in rollouts.
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX as QWEN2_PRETOKENIZE_REGEX

__all__ = [
    "CHATML_TEMPLATE",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "QWEN2_PRETOKENIZE_REGEX",
    "SPECIAL_TOKENS",
    "train_tokenizer",
]

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [EOS_TOKEN, PAD_TOKEN, IM_START, IM_END]

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""ChatML, as Qwen2/Qwen2.5 use it (without their default system message)."""


def train_tokenizer(
    texts: Iterable[str], vocab_size: int = 4096, min_frequency: int = 2
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on ``texts`` (code, problem statements, demonstrations).

    Every byte is in the initial alphabet, so any text encodes; ``<|im_end|>`` ends an answer
    and is the EOS token, as in Qwen's instruct models.

    Raises:
        ValueError: if ``vocab_size`` cannot hold the byte alphabet and the special tokens.
    """
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + len(SPECIAL_TOKENS):
        raise ValueError(
            f"vocab_size {vocab_size} is below the {len(alphabet) + len(SPECIAL_TOKENS)} base tokens"
        )
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=IM_END, pad_token=PAD_TOKEN, bos_token=None, unk_token=None
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast
