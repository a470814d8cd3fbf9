"""The edge's side of batch jobs (OpenAI's Batch API): the routes, and creating, reading and cancelling batches."""
