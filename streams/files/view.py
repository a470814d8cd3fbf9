"""Every file's metadata, as the compacted files topic says: what each edge serves `/v1/files` from.

The view follows the topic from its start (:class:`~streams.kafka.compacted_table.CompactedTable`), so a restarted or second
edge knows the same files (within one poll, 0.2 s, of a change; a lookup by id that misses catches up with the topic
first, so an id just uploaded through another edge is found). Until it has read up to the end the topic had
when it started, it is not ``caught_up`` and the API answers 503 rather than "no such file". A tombstone deletes;
one edge writes a file's records, so the record read last wins.
"""
from __future__ import annotations

from schemas.documents import FileObject
from schemas.topics import Topic
from streams.kafka.compacted_table import BackgroundView, CompactedTable, replace
from streams.kafka.connection import Connectable


class FilesView(BackgroundView[FileObject]):
    def __init__(self, kafka: Connectable, topic: Topic) -> None:
        """The topic must exist when it starts (the edge creates it at start)."""
        super().__init__(CompactedTable(kafka, topic, FileObject, policy=replace(), create_topic=False))
        self.files: dict[str, FileObject] = self.table.rows

    def apply(self, file_id: str, file: FileObject | None) -> None:
        """Record what this edge just wrote (a file, or its deletion: None), before it reads it back."""
        if file is None:
            self.table.delete(file_id)
        else:
            self.table.put(file_id, file)
