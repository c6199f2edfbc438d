"""The data contracts every stage reads and writes (JSONL records, validated with pydantic).

One module per record: :mod:`~gagar.schema.task` (Task, SWE-bench compatible),
:mod:`~gagar.schema.trajectory` (Trajectory, its messages and sampling parameters),
:mod:`~gagar.schema.result` (TestResult, its status, per-test outcomes and hack flags),
:mod:`~gagar.schema.grade` (Grade, a group's ranking), :mod:`~gagar.schema.selection`
(GeneratedBatch, one generation batch with its results; Selection, what dynamic sampling kept, and
its record KeptBatch of KeptTrajectory) and :mod:`~gagar.schema.batch` (BatchEntry, a kept
trajectory of the train batch with its advantage). They depend on nothing else in gagar but
:mod:`gagar.records`, so any package can import them without cycles.
"""

from gagar.schema.batch import BatchEntry
from gagar.schema.grade import Grade
from gagar.schema.result import HackFlag, HackKind, Outcome, Status, TestResult
from gagar.schema.selection import GeneratedBatch, KeptBatch, KeptTrajectory, Selection
from gagar.schema.task import Environment, Task
from gagar.schema.trajectory import Message, SamplingParams, Trajectory

__all__ = [
    "BatchEntry",
    "Environment",
    "GeneratedBatch",
    "Grade",
    "HackFlag",
    "HackKind",
    "KeptBatch",
    "KeptTrajectory",
    "Message",
    "Outcome",
    "SamplingParams",
    "Selection",
    "Status",
    "Task",
    "TestResult",
    "Trajectory",
]
