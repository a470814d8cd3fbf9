"""An incremental server-sent-events parser (the subset the HTML spec defines that OpenAI streams use).

Bytes go in as they arrive; complete events come out. Lines end in LF, CRLF or
CR; a blank line dispatches the event; ``data:`` lines of one event are joined
with LF; lines starting with ``:`` are comments; one space after the colon is
dropped. Data is decoded as UTF-8 only once a whole line is in, so a character
split across network reads is never broken.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SSEEvent:
    data: str
    event: str = "message"
    id: str | None = None
    retry: int | None = None


class SSEParser:
    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []
        self._event = ""
        self._id: str | None = None
        self._retry: int | None = None
        self._pending_cr = False

    def feed(self, chunk: bytes | str) -> list[SSEEvent]:
        if isinstance(chunk, str):
            chunk = chunk.encode("utf-8")
        if self._pending_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]  # the LF of a CRLF split across two reads
        self._pending_cr = False
        self._buffer += chunk
        events: list[SSEEvent] = []
        while True:
            cut = _line_end(self._buffer)
            if cut is None:
                break
            end, width = cut
            raw = self._buffer[:end]
            if width == 1 and self._buffer[end:end + 1] == b"\r" and end + 1 == len(self._buffer):
                self._pending_cr = True  # a CR at the very end may be half of a CRLF
            self._buffer = self._buffer[end + width:]
            event = self._line(raw.decode("utf-8", errors="replace"))
            if event is not None:
                events.append(event)
        return events

    def close(self) -> list[SSEEvent]:
        """End of stream: an event without its terminating blank line is discarded, as the spec says."""
        self._buffer = b""
        self._data = []
        return []

    @property
    def has_partial(self) -> bool:
        """True when bytes or fields of an undispatched event are pending (a stream cut mid-event)."""
        return bool(self._buffer.strip()) or bool(self._data)

    def _line(self, line: str) -> SSEEvent | None:
        if line == "":
            if not self._data:
                self._event = ""
                return None
            event = SSEEvent(data="\n".join(self._data), event=self._event or "message", id=self._id, retry=self._retry)
            self._data = []
            self._event = ""
            return event
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self._id = value
        elif name == "retry":
            if value.isdigit():
                self._retry = int(value)
        return None


def _line_end(buffer: bytes) -> tuple[int, int] | None:
    """(index, width) of the first line terminator, or None."""
    lf = buffer.find(b"\n")
    cr = buffer.find(b"\r")
    if cr == -1 and lf == -1:
        return None
    if cr == -1 or (lf != -1 and lf < cr):
        return lf, 1
    if cr + 1 < len(buffer) and buffer[cr + 1:cr + 2] == b"\n":
        return cr, 2
    return cr, 1
