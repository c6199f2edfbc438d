"""Teacher transcripts from the oracle, their SFT tokens, the LLM grader's SFT and its warm server."""

from __future__ import annotations

import json
import random
import urllib.request
from pathlib import Path

import pytest

from gagar.grader.base import grade_group
from gagar.grader.llm import FinalAnswer, LLMGrader, parse_json_object
from gagar.grader.llm_client import ChatClient
from gagar.grader.llm_sft import grader_sft_config, train_llm_grader
from gagar.grader.sft import noise_groups
from gagar.grader.transcripts import render, teacher_transcript, transcript_demos
from gagar.policy.generation import HFBackend
from gagar.policy.model import load_policy
from gagar.policy.server import running_server
from gagar.tasks.generate import generate_task
from gagar.tasks.oracle import score_patch

TASKS = [generate_task(index, 31, verify=False) for index in range(3)]


@pytest.fixture(scope="module")
def groups():
    return noise_groups(TASKS, groups_per_task=1, seed=2)


def test_transcript_runs_the_tools_and_ranks_like_the_oracle(groups, tmp_path: Path) -> None:
    group = groups[0]
    one = teacher_transcript(group, tmp_path, random.Random(0))
    other = teacher_transcript(group, tmp_path, random.Random(1))
    assert list(one.aliases.values()) != list(other.aliases.values())  # the order is shuffled per example
    roles = [m["role"] for m in one.messages]
    assert roles[:2] == ["system", "user"]
    assert roles[2:] == ["assistant", "user"] * 5 + ["assistant"]
    results = [m["content"] for m in one.messages if m["content"].startswith("TOOL RESULT")]
    assert results[0].startswith("TOOL RESULT diff_stats: c1: ")
    assert all(f"c{i}:" in results[0] for i in range(1, len(one.aliases) + 1))
    assert "--- c" in results[4]  # the pairwise diff names files by alias
    final = one.messages[-1]["content"]
    answer = FinalAnswer.model_validate(parse_json_object(final))
    assert answer.tiers() == one.ranking
    assert list(answer.scores) == list(one.aliases)  # in alias order: copied row by row from the notes
    patches = {c.trajectory_id: c.patch for c in group.candidates}
    quality = {a: score_patch(group.task, patches[t]).quality for a, t in one.aliases.items()}
    flat = [a for tier in one.ranking for a in tier]
    assert [quality[a] for a in flat] == sorted(quality.values(), reverse=True)
    assert all(f"{a}: fit " in final for a in one.aliases)


def test_demos_carry_the_loss_on_assistant_turns_only(groups, tmp_path: Path) -> None:
    transcript = teacher_transcript(groups[1], tmp_path, random.Random(0))
    out = tmp_path / "grader"
    config = grader_sft_config(
        steps=1, batch_size=1, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64
    )
    train_llm_grader([transcript], out, config, progress=False)
    _, tokenizer = load_policy(out)
    [demo], dropped = transcript_demos([transcript], tokenizer, 4096)
    assert dropped == 0
    learned = tokenizer.decode([t for t, m in zip(demo.answer_ids, demo.answer_mask, strict=True) if m])
    expected = "".join(m["content"] + "<|im_end|>" for m in transcript.messages if m["role"] == "assistant")
    assert learned == expected
    assert tokenizer.decode(demo.prompt_ids + demo.answer_ids) == render(transcript, tokenizer)
    assert transcript_demos([transcript], tokenizer, 10) == ([], 1)


def test_sft_resumes_saves_hf_with_chat_template_and_serves_chat(groups, tmp_path: Path) -> None:
    from gagar.grader.llm_sft import build_transcripts

    transcripts = build_transcripts(groups, seed=0, progress=False)
    config = grader_sft_config(steps=3, batch_size=2, hidden_size=32, num_layers=1, num_heads=2,
                               intermediate_size=64, checkpoint_every=1)  # fmt: skip
    out = tmp_path / "grader"
    partial = train_llm_grader(transcripts, out, config, progress=False, until_step=2)
    assert len(partial.losses) == 2
    assert not (out / "model.safetensors").exists()
    done = train_llm_grader(transcripts, out, config, resume=True, progress=False)
    assert len(done.losses) == 3
    assert done.losses[:2] == partial.losses
    assert (out / "loss_curve.png").is_file()
    assert len((out / "transcripts.jsonl").read_text().splitlines()) == len(transcripts)
    model, tokenizer = load_policy(out)
    assert tokenizer.chat_template
    with running_server(HFBackend(model, tokenizer), tokenizer, "grader") as url:
        body = {"model": "grader", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        request = urllib.request.Request(f"{url}/chat/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        reply = json.loads(urllib.request.urlopen(request, timeout=60).read())
        assert reply["object"] == "chat.completion"
        assert isinstance(reply["choices"][0]["message"]["content"], str)
        grader = LLMGrader(ChatClient(url, "grader", max_tokens=8), max_steps=2, total_timeout_s=60)
        grade = grade_group(grader, groups[0].workspace(tmp_path / "ws"))
        assert grade.grader == "llm"  # an untrained model: a fallback with its reason, never an exception
        assert grade.fallback == (grade.fallback_reason is not None)
