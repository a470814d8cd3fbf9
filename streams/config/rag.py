"""The `rag` section: the indexer/retriever service (embedding, Qdrant, retrieval) and its consumer settings."""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from streams.config.services import WorkerSettings


class RagSettings(WorkerSettings):
    """The rag service is a consumer on the foundation like a worker: the worker's consumer keys apply to it
    (id, group_id, max_message_bytes, heartbeat_s, max_inflight, drain_timeout_s, session and heartbeat)."""

    state_dir: str | None = Field(
        default=None,
        description="Where the rag service keeps its local Qdrant index (<state_dir>/<topic prefix>/qdrant); null: "
        "<state root>/rag ($SPECSTREAM_STATE_DIR or ~/.local/state/specstream). Only that one process opens it; "
        "every other service asks it over the bus.",
    )
    qdrant_url: str | None = Field(
        default=None, description="A Qdrant server (e.g. http://qdrant:6333) instead of the local on-disk index; "
        "same code path (the client's API), for several machines.",
    )
    qdrant_api_key: str | None = Field(default=None, description="API key of the Qdrant server, when it needs one.")
    embed_batch_size: int = Field(default=32, ge=1, le=1024, description="Chunks embedded per forward pass.")
    embed_threads: int = Field(
        default=0, ge=0, le=256, description="Torch threads of the embedding model; 0: half the cores, at most 8."
    )
    hybrid: bool = Field(
        default=False, description="Fuse BM25 keyword scores with the vector scores (search and file_search)."
    )
    fusion: Literal["rrf", "weighted"] = Field(
        default="weighted", description="How hybrid search fuses the two rankings: weighted ((1 - bm25_weight) * "
        "cosine + bm25_weight * BM25 / best BM25) or rrf (reciprocal rank fusion, 1/(rrf_k + rank) summed).",
    )
    rrf_k: int = Field(default=60, ge=1, le=1000, description="RRF's k: larger flattens the top ranks' lead.")
    bm25_weight: float = Field(
        default=0.3, ge=0.0, le=1.0, description="Share of the fused score that comes from BM25 when fusion is weighted."
    )
    default_max_num_results: int = Field(
        default=4, ge=1, le=50, description="Passages a file_search tool or search gets when it sets no max_num_results."
    )
    max_prompt_chars: int = Field(
        default=6000, ge=200, description="Most characters of passages put into a grounded prompt (the first "
        "passage always goes in, cut if it must be); keep it within the model's context."
    )
    search_timeout_s: float = Field(
        default=30.0, gt=0, description="How long the edge waits for the retriever's answer to a search."
    )

    def qdrant_path(self, topic_prefix: str) -> Path:
        """One index per deployment (topic prefix): two deployments on one host never share a folder."""
        from infra.kafka.paths import state_root

        root = Path(self.state_dir).expanduser() if self.state_dir else state_root() / "rag"
        return root / topic_prefix / "qdrant"

    def resolved_group_id(self, topic_prefix: str) -> str:
        return self.group_id or f"{topic_prefix}.rag"
