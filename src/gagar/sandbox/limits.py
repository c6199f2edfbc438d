"""Resource limits of one sandboxed evaluation, shared by every backend.

Each field can be set from the environment (``GAGAR_LIMITS__<FIELD>``), e.g.
``GAGAR_LIMITS__WALL_TIME_S=120``.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["SandboxLimits"]

MiB = 1 << 20


class SandboxLimits(BaseSettings):
    """What one evaluation may use before it is stopped."""

    model_config = SettingsConfigDict(env_prefix="GAGAR_LIMITS__", frozen=True, extra="forbid")

    wall_time_s: float = Field(600.0, gt=0)
    """Wall-clock deadline of the test run (env GAGAR_LIMITS__WALL_TIME_S)."""
    cpu_time_s: int = Field(600, gt=0)
    """CPU seconds per process (RLIMIT_CPU) (env GAGAR_LIMITS__CPU_TIME_S)."""
    memory_bytes: int = Field(4096 * MiB, gt=0)
    """Address space per process (RLIMIT_AS) (env GAGAR_LIMITS__MEMORY_BYTES)."""
    max_processes: int = Field(256, gt=0)
    """Processes and threads of the sandbox uid (RLIMIT_NPROC) (env GAGAR_LIMITS__MAX_PROCESSES)."""
    max_file_bytes: int = Field(256 * MiB, gt=0)
    """Largest file a process may write (RLIMIT_FSIZE) (env GAGAR_LIMITS__MAX_FILE_BYTES)."""
    tmp_bytes: int = Field(256 * MiB, gt=0)
    """Size of the private /tmp (env GAGAR_LIMITS__TMP_BYTES)."""
    max_output_bytes: int = Field(16 * MiB, gt=0)
    """Combined stdout and stderr before the run is stopped (env GAGAR_LIMITS__MAX_OUTPUT_BYTES)."""
    log_chars: int = Field(20_000, gt=0)
    """Characters of output kept in a TestResult: head and tail (env GAGAR_LIMITS__LOG_CHARS)."""
    max_patch_bytes: int = Field(2 * MiB, gt=0)
    """Largest model patch accepted (env GAGAR_LIMITS__MAX_PATCH_BYTES)."""
    max_report_bytes: int = Field(32 * MiB, gt=0)
    """Largest judge report read back (env GAGAR_LIMITS__MAX_REPORT_BYTES)."""
