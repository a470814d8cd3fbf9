"""The sections of files and documents: the blob store of uploaded files, and the document parser service."""
from __future__ import annotations

from pydantic import Field

from streams.config.base import _TOPIC_SAFE, MIB, ByteSize, Section, host_pid_id
from streams.config.services import ConsumerSettings


class FilesSettings(Section):
    dir: str | None = Field(
        default=None,
        description="Folder of the uploaded files' bytes (the blob store); null: <state root>/files, the state root "
        "being $SPECSTREAM_STATE_DIR or ~/.local/state/specstream. Edges, parsers and batch runners on several "
        "hosts need it on shared storage.",
    )
    max_bytes: ByteSize = Field(
        default=512 * MIB, ge=1, description="Largest file `POST /v1/files` accepts; larger uploads get 413.",
    )


class ParserSettings(ConsumerSettings):
    """The document parser (`specstream parser`): a consumer of <prefix>.ingest-jobs on the foundation."""

    id: str | None = Field(
        default=None, min_length=1, max_length=128, pattern=_TOPIC_SAFE,
        description="Parser id in announcements and dead letters; null: <hostname>-<pid>.",
    )
    max_inflight: int = Field(
        default=2, ge=1, description="Jobs parsed at once (each in a thread); beyond it the parser stops reading jobs.",
    )
    max_message_bytes: ByteSize = Field(
        default=64 * 1024, ge=1024, description="Larger ingest-job messages are dead-lettered (message_too_large).",
    )
    max_text_chars: int = Field(
        default=20_000_000, ge=1000,
        description="Most characters of text extracted from one file; a file with more fails (invalid_file).",
    )
    heartbeat_s: float = Field(default=5.0, gt=0, description="Seconds between `ready` announcements.")
    drain_timeout_s: float = Field(
        default=30.0, ge=0, description="On shutdown, seconds to finish jobs in progress before handing them back.",
    )
    session_timeout_ms: int = Field(
        default=10_000, ge=1000, le=300_000,
        description="Consumer-group session timeout: a parser killed without warning loses its jobs to the others "
        "after this long.",
    )
    heartbeat_interval_ms: int = Field(default=1000, ge=100, description="Consumer-group heartbeats.")

    def resolved_id(self) -> str:
        return self.id or host_pid_id("parser")
