"""Documents and retrieval (docs/retrieval.md): the document parser, and what builds on it."""
