"""The OpenAI wire contract that the edge, the worker and batch jobs all speak: how a chat request becomes the
model's prompt (:mod:`streams.wire.chat_template`) and how a model's tool-call tags become OpenAI's ``tool_calls``
(:mod:`streams.wire.tool_calls`). It imports no other room of ``streams/``, so each of them may import it."""
