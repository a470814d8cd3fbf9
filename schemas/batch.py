"""Events of offline batch jobs (OpenAI's Batch API) on the bus.

A batch's lines travel as ordinary ``GenerateRequest`` events on ``<prefix>.batch-lines`` (request id
``<batch id>.<line>``, priority :data:`BATCH_PRIORITY`), their answers (``Completion`` / ``ErrorEvent``) on
``<prefix>.batch-results``, and each batch's state as :class:`BatchState` on the compacted ``<prefix>.batches``.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel

from schemas.events import Completion, ErrorEvent, Event

# The lowest priority there is (GenerateRequest.priority ranges -10..10): the engine's scheduler treats requests at
# or above engine.batch_priority (10) as batch work, which holds at most engine.batch_max_share of its slots.
BATCH_PRIORITY = 10

BatchStatus = Literal["validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling",
                      "cancelled"]


class BatchRequestCounts(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    total: int = Field(default=0, ge=0, description="Lines in the batch's input file.")
    completed: int = Field(default=0, ge=0, description="Lines answered with a response (in the output file).")
    failed: int = Field(default=0, ge=0, description="Lines that failed (in the error file), expired or cancelled "
                        "lines included.")


class BatchLineError(BaseModel):
    """One problem of the batch as a whole (OpenAI's ``errors.data[i]``), e.g. its input file is gone."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    code: str = Field(description="Machine-readable code, e.g. input_file_missing.")
    message: str = Field(description="What went wrong.")
    line: int | None = Field(default=None, description="The input line at fault (1-based), when one is.")
    param: str | None = Field(default=None, description="The field at fault, when one is.")


class BatchState(Event):
    """One batch as OpenAI's ``Batch`` object describes it, keyed by its id on the compacted batches topic.

    The edge writes it when the batch is created or cancelled, the assembler as lines are answered and when the
    output files are written. Every reader merges what it reads with what it knows (:mod:`streams.batch.book`):
    statuses only move forward, counts only grow, so the writers never undo each other."""

    type: Literal["batch"] = "batch"
    id: str = Field(min_length=1, max_length=64, description="The batch's id, batch_<hex>.")
    tenant: str = Field(min_length=1, max_length=64, description="Tenant that created it; only it sees the batch.")
    endpoint: Literal["/v1/chat/completions", "/v1/completions"] = Field(description="What each line calls.")
    input_file_id: str = Field(min_length=1, description="The JSONL file of the lines.")
    completion_window: Literal["24h"] = Field(default="24h", description="How long the batch may take.")
    status: BatchStatus = Field(description="Where the batch is in its life.")
    created_at: int = Field(description="Unix time (s) it was created.")
    expires_at: int = Field(description="Unix time (s) after which lines not yet started are not run.")
    in_progress_at: int | None = Field(default=None, description="When its lines were on the bus.")
    finalizing_at: int | None = Field(default=None, description="When every line was answered.")
    completed_at: int | None = Field(default=None, description="When its output files were written.")
    failed_at: int | None = Field(default=None, description="When it failed as a whole.")
    expired_at: int | None = Field(default=None, description="When it ended with lines expired.")
    cancelling_at: int | None = Field(default=None, description="When a cancel was asked.")
    cancelled_at: int | None = Field(default=None, description="When a cancelled batch's files were written.")
    request_counts: BatchRequestCounts = Field(default_factory=BatchRequestCounts, description="Progress.")
    estimated_tokens: int = Field(default=0, ge=0, description="Prompt + max_tokens of every line, counted when "
                                  "the batch was created: what it spends of its tenant's batch_tokens_per_day.")
    answered: int = Field(default=0, ge=0, description="Lines with an outcome, not run ones (cancelled, expired) "
                          "included; the batch finalizes when it reaches request_counts.total.")
    output_file_id: str | None = Field(default=None, description="JSONL of the responses.")
    error_file_id: str | None = Field(default=None, description="JSONL of the failed lines.")
    errors: list[BatchLineError] = Field(default_factory=list, description="Why the batch failed as a whole.")
    metadata: dict[str, str] | None = Field(default=None, description="The client's labels (16 pairs at most).")
    at: float = Field(description="Unix time of this state.")


class BatchLineReply(RootModel[Annotated[Completion | ErrorEvent, Field(discriminator="type")]]):
    """The answer to one batch line, as the engine worker sends it to ``<prefix>.batch-results``."""

    @property
    def request_id(self) -> str:
        return self.root.request_id or ""


def line_request_id(batch_id: str, line: int) -> str:
    """The request id of a batch's line (1-based): a redelivered line keeps it, so it is answered once."""
    return f"{batch_id}.{line}"


def parse_line_request_id(request_id: str) -> tuple[str, int] | None:
    """(batch id, line) of a batch line's request id; None for any other id."""
    batch_id, _, line = request_id.rpartition(".")
    if not batch_id.startswith("batch_") or not line.isdigit():
        return None
    return batch_id, int(line)
