"""Log filters every consumer process wants: FastStream's and aiokafka's noise about our own topic layout."""
from __future__ import annotations

import logging

from streams.telemetry.logs import throttle_missing_topic_errors

# FastStream's own lines (per-message, lifecycle) go to a logger of ours that the CLI keeps at WARNING (not under
# "faststream": importing FastStream sets that one to INFO, after the CLI configured logging).
faststream_log = logging.getLogger("specstream.faststream")


class _DropDeclaredTopicWarning(logging.Filter):
    """Our topics are created from the catalog on purpose, so FastStream's reminder that it will not create them is noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Auto create topics is disabled" not in record.getMessage()


faststream_log.addFilter(_DropDeclaredTopicWarning())
throttle_missing_topic_errors()  # also installed by every command's logging set-up (the edge's included)
