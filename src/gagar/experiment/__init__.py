"""The GRPO-vs-GAGAR experiment (issue #8): config, harness, held-out evaluation, statistics, report."""

from gagar.experiment.config import ArmConfig, EvalSettings, ExperimentConfig, load_experiment_config
from gagar.experiment.harness import run_experiment
from gagar.experiment.report import write_report

__all__ = [
    "ArmConfig",
    "EvalSettings",
    "ExperimentConfig",
    "load_experiment_config",
    "run_experiment",
    "write_report",
]
