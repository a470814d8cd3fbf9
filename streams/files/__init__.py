"""Uploaded files: the blob store of their bytes, their metadata on the compacted files topic, and the checks a
purpose makes of their content (docs/retrieval.md)."""
