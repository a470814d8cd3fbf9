from schemas.events import (
    SCHEMA_VERSION,
    CancelRequest,
    ChatMessage,
    DeadLetter,
    EdgeAnnouncement,
    Completion,
    ErrorEvent,
    GenerateRequest,
    ReplyEvent,
    ReplyRoute,
    RolloutState,
    SamplingParams,
    ServiceAnnouncement,
    SpecStats,
    SpecStepStats,
    Timings,
    TokenChunk,
    TraceContext,
    Usage,
    WorkerAnnouncement,
)

__all__ = [
    "SCHEMA_VERSION", "CancelRequest", "ChatMessage", "DeadLetter", "EdgeAnnouncement", "Completion", "ErrorEvent", "GenerateRequest", "ReplyEvent",
    "ReplyRoute", "RolloutState", "SamplingParams", "ServiceAnnouncement", "SpecStats", "SpecStepStats", "Timings", "TokenChunk", "TraceContext", "Usage",
    "WorkerAnnouncement",
]
