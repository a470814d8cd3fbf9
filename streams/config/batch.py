"""The ``batch:`` section: offline batch jobs (OpenAI's Batch API), their input limits and their assembler."""
from __future__ import annotations

from pydantic import Field

from streams.config.base import _TOPIC_SAFE, MIB, ByteSize, Section, host_pid_id
from streams.config.services import WorkerSettings


class BatchAssemblerSettings(WorkerSettings):
    """The batch assembler: a consumer of <prefix>.batch-results that writes each batch's output and error files.
    Its consumer options mean what they mean for an engine worker; a message is one line's answer."""

    id: str | None = Field(
        default=None, min_length=1, max_length=128, pattern=_TOPIC_SAFE,
        description="Assembler id in announcements and dead letters; null: assembler-<hostname>-<pid>.",
    )
    group_id: str | None = Field(
        default=None, min_length=1, description="Consumer group of the batch-results topic; null: "
        "<topic_prefix>.batch-assemblers.",
    )
    max_inflight: int = Field(default=256, ge=1, description="Most line answers held before they are written.")
    max_message_bytes: ByteSize = Field(
        default=MIB, ge=1024, description="Larger answer messages are rejected (message_too_large) and dead-lettered.",
    )
    drain_timeout_s: float = Field(
        default=30.0, ge=0, description="On shutdown, seconds to finish writing held answers; the rest are redelivered.",
    )
    session_timeout_ms: int = Field(
        default=6000, ge=1000, le=300_000,
        description="Consumer-group session timeout: an assembler killed without warning loses its partitions of "
        "batch-results to another after this long.",
    )
    heartbeat_interval_ms: int = Field(default=1000, ge=100, description="Consumer-group heartbeats.")
    progress_interval_s: float = Field(
        default=1.0, gt=0, description="Seconds between request_counts updates of a running batch on the batches topic.",
    )

    def resolved_id(self) -> str:
        return self.id or f"assembler-{host_pid_id('host')}"

    def resolved_group_id(self, topic_prefix: str) -> str:
        return self.group_id or f"{topic_prefix}.batch-assemblers"


class BatchSettings(Section):
    max_file_bytes: ByteSize = Field(
        default=100 * MIB, ge=1024, description="Largest batch input file (purpose=batch) accepted on upload.",
    )
    max_lines: int = Field(default=50_000, ge=1, description="Most lines (requests) in one batch input file.")
    max_line_bytes: ByteSize = Field(
        default=MIB - 64 * 1024, ge=1024,
        description="Largest line of a batch input file; it travels as one message on the batch-lines topic.",
    )
    worker_slots: int = Field(
        default=8, ge=1, description="Batch lines an engine worker holds at once (running or queued in its engine); "
        "the rest wait on the batch-lines topic. engine.batch_max_share bounds how many of them run.",
    )
    assembler: BatchAssemblerSettings = Field(default_factory=BatchAssemblerSettings)
