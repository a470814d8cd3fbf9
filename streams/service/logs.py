"""Log filters every consumer process wants: FastStream's and aiokafka's noise about our own topic layout."""
from __future__ import annotations

import logging

# FastStream's own lines (per-message, lifecycle): a child of "faststream", which the CLI keeps at WARNING.
faststream_log = logging.getLogger("faststream.specstream")


class _DropDeclaredTopicWarning(logging.Filter):
    """Our topics are created from the catalog on purpose, so FastStream's reminder that it will not create them is noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Auto create topics is disabled" not in record.getMessage()


class _DropGoneReplyTopicErrors(logging.Filter):
    """Reply topics come and go (an edge shuts down, `specstream send` deletes its own), but the producer keeps
    asking for every topic it ever wrote to and logs an ERROR per refresh for each one that is gone."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == "Topic %s not found in cluster metadata" and record.args:
            return ".replies." not in str(record.args[0])
        return True


faststream_log.addFilter(_DropDeclaredTopicWarning())
logging.getLogger("aiokafka.cluster").addFilter(_DropGoneReplyTopicErrors())
