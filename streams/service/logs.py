"""Log filters every consumer process wants: FastStream's and aiokafka's noise about our own topic layout."""
from __future__ import annotations

import logging
import time

# FastStream's own lines (per-message, lifecycle) go to a logger of ours that the CLI keeps at WARNING (not under
# "faststream": importing FastStream sets that one to INFO, after the CLI configured logging).
faststream_log = logging.getLogger("specstream.faststream")


class _DropDeclaredTopicWarning(logging.Filter):
    """Our topics are created from the catalog on purpose, so FastStream's reminder that it will not create them is noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Auto create topics is disabled" not in record.getMessage()


class _ThrottleMissingTopicErrors(logging.Filter):
    """Reply topics come and go (an edge shuts down, `specstream send` deletes its own), but the producer keeps
    asking for every topic it ever wrote to and logs an ERROR per metadata refresh (several a second) for each one
    that is gone. Keep one line per topic and interval: enough to see it, not enough to bury everything else."""

    interval_s = 60.0

    def __init__(self) -> None:
        super().__init__()
        self._last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != "Topic %s not found in cluster metadata" or not record.args:
            return True
        topic = str(record.args[0] if isinstance(record.args, tuple) else record.args)
        now = time.monotonic()
        if now - self._last.get(topic, -self.interval_s) < self.interval_s:
            return False
        if len(self._last) > 10_000:
            self._last.clear()
        self._last[topic] = now
        return True


faststream_log.addFilter(_DropDeclaredTopicWarning())
logging.getLogger("aiokafka.cluster").addFilter(_ThrottleMissingTopicErrors())
