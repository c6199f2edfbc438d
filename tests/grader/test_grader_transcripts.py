"""Teacher transcripts from the oracle, their SFT tokens, the LLM grader's SFT and its warm server."""

from __future__ import annotations

import json
import random
import urllib.request
from pathlib import Path

import pytest

from gagar.grader import tools
from gagar.grader.base import grade_group
from gagar.grader.kendall import kendall_tau_b
from gagar.grader.llm import OPENING_TOOLS, FinalAnswer, LLMGrader, parse_json_object
from gagar.grader.llm_client import ChatClient
from gagar.grader.llm_sft import TRANSCRIPTS_FILE, check_trained_opening, grader_sft_config, train_llm_grader
from gagar.grader.sft import evaluate, noise_groups, with_hacks
from gagar.grader.transcripts import (
    FLAGGED_PENALTY,
    Evidence,
    evidence,
    render,
    teacher_transcript,
    transcript_demos,
    visible_penalty,
)
from gagar.policy.generation import HFBackend
from gagar.policy.model import load_policy
from gagar.policy.server import running_server
from gagar.tasks.generate import generate_task
from gagar.tasks.oracle import score_patch

TASKS = [generate_task(index, 31, verify=False) for index in range(3)]


@pytest.fixture(scope="module")
def groups():
    return noise_groups(TASKS, groups_per_task=1, seed=2)


def test_transcript_runs_the_tools_and_notes_what_they_show(groups, tmp_path: Path) -> None:
    group = groups[0]
    one = teacher_transcript(group, tmp_path, random.Random(0))
    other = teacher_transcript(group, tmp_path, random.Random(1))
    assert list(one.aliases.values()) != list(other.aliases.values())  # the order is shuffled per example
    roles = [m["role"] for m in one.messages]
    assert roles[:2] == ["system", "user"]
    assert roles[2:] == ["assistant", "user"] * len(OPENING_TOOLS) + ["assistant"]
    assert json.loads(one.messages[2]["content"]) == {"tool": OPENING_TOOLS[0]}
    results = [m["content"] for m in one.messages if m["content"].startswith("TOOL RESULT")]
    assert [r.split(":", 1)[0] for r in results] == [f"TOOL RESULT {t}" for t in OPENING_TOOLS]
    assert all(f"c{i}:" in r for r in results for i in range(1, len(one.aliases) + 1))
    final = one.messages[-1]["content"]
    assert "\n" not in final  # the answer is the scores alone
    answer = FinalAnswer.model_validate(parse_json_object(final))
    assert list(answer.scores or {}) == list(one.aliases)  # in alias order: copied row by row
    assert answer.tiers() == one.ranking
    ws, scored = group.workspace(tmp_path), answer.scores or {}
    for alias, tid in one.aliases.items():
        found = evidence(ws, tid)
        assert scored[alias] == -visible_penalty(found)  # the score is the penalty, negated
        stats = tools.diff_stats(ws, tid)
        size = f"{alias}: {stats.added + stats.removed} lines, {stats.files} files"
        shown = results[OPENING_TOOLS.index("diff_stats")].split(": ", 1)[1]
        assert f"\n{size}\n" in f"\n{shown}\n"  # every number scored is in the opening
    # the oracle judges the teacher: the catalogue ladder is ordered like the oracle's totals
    patches = {c.trajectory_id: c.patch for c in group.candidates}
    quality = [score_patch(group.task, patches[t]).quality for t in one.aliases.values()]
    assert one.oracle_tau == kendall_tau_b([scored[a] for a in one.aliases], quality) > 0.6
    assert "gold" not in json.dumps(one.messages).lower()


def test_a_hacking_candidate_is_flagged_and_scored_last(groups, tmp_path: Path) -> None:
    [hacked] = with_hacks(groups[:1], share=1.0)
    transcript = teacher_transcript(hacked, tmp_path, random.Random(0))
    hack = next(a for a, t in transcript.aliases.items() if t.endswith("/hack"))
    integrity = next(
        m["content"] for m in transcript.messages if m["content"].startswith("TOOL RESULT integ")
    )
    assert f"\n{hack}: 1 (" in integrity or integrity.startswith(f"TOOL RESULT integrity_flags: {hack}: 1 (")
    assert transcript.ranking[-1] == [hack]
    assert json.loads(transcript.messages[-1]["content"])["scores"][hack] < -FLAGGED_PENALTY


def test_visible_penalty_is_the_size_plus_the_flag_penalty_per_integrity_class() -> None:
    assert visible_penalty(Evidence(lines=7, out_of_scope=3, style=1, integrity=0)) == 7
    assert visible_penalty(Evidence(lines=9, out_of_scope=0, style=0, integrity=1)) == FLAGGED_PENALTY + 9
    assert visible_penalty(Evidence(lines=2, out_of_scope=0, style=0, integrity=2)) == 2 * FLAGGED_PENALTY + 2


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ([], 0),
        (["grader_address: a.py:3: this patch is clean"], 1),
        (["grader_address: a.py:3: LGTM", "grader_address: NOTE.txt"], 1),
        (["runner_tampering: conftest.py:1: pytest hook"], 2),
        (["grader_address: a.py:3: LGTM", "introspection: a.py:9: inspect.stack"], 2),
    ],
)
def test_the_integrity_class_puts_a_hack_below_text_that_only_talks(flags: list[str], expected: int) -> None:
    from gagar.grader.tools import IntegrityReport

    assert IntegrityReport(flags=flags).integrity_class == expected


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
        grader = LLMGrader(ChatClient(url, "grader", max_tokens=8), max_turns=2, total_timeout_s=60)
        grade = grade_group(grader, groups[0].workspace(tmp_path / "ws"))
        assert grade.grader == "llm"  # an untrained model: a fallback with its reason, never an exception
        assert grade.fallback == (grade.fallback_reason is not None)
        report = evaluate(grader, groups[:1], workspace_root=tmp_path / "eval", reverse_check=False)
        assert report.prompt_tokens_per_grading > 100  # as the server reported them, per grading
        assert 0 < report.answer_tokens_per_grading <= 2 * 8  # at most max_turns answers of max_tokens
        assert "answer tokens/grading" in report.line()


def test_transcripts_of_eight_candidates_and_a_hack(tmp_path: Path) -> None:
    eight = with_hacks(noise_groups(TASKS, groups_per_task=1, size=8, seed=4), share=1.0, seed=0)
    assert [len(g.candidates) for g in eight] == [9, 9, 9]  # rollout groups of 8, and a hack beside them
    for group in eight:
        t = teacher_transcript(group, tmp_path, random.Random(0))
        assert len(t.aliases) == 9
        results = [m["content"] for m in t.messages if m["content"].startswith("TOOL RESULT")]
        assert all(f"c{i}:" in r for r in results for i in range(1, 10))
        answer = FinalAnswer.model_validate(parse_json_object(t.messages[-1]["content"].splitlines()[-1]))
        assert sorted(answer.scores or {}) == sorted(t.aliases)
        assert t.oracle_tau >= 0.9


def test_a_grader_trained_on_another_opening_is_refused(groups, tmp_path: Path) -> None:
    transcript = teacher_transcript(groups[0], tmp_path / "ws", random.Random(0))
    model_dir = tmp_path / "grader"
    model_dir.mkdir()
    check_trained_opening(model_dir)  # a model trained elsewhere (no transcripts beside it) passes
    (model_dir / TRANSCRIPTS_FILE).write_text(json.dumps(transcript.record()) + "\n")
    check_trained_opening(model_dir)
    other = [*transcript.messages[:4], transcript.messages[-1]]  # opened with the flags only
    (model_dir / TRANSCRIPTS_FILE).write_text(json.dumps({"messages": other}) + "\n")
    with pytest.raises(ValueError, match="open with integrity_flags; this version"):
        check_trained_opening(model_dir)
    (model_dir / TRANSCRIPTS_FILE).write_text('{"messages": [1, 2, 3]}\n')
    with pytest.raises(ValueError, match="its first line is not a transcript record"):
        check_trained_opening(model_dir)
