"""The OpenAI wire contract that the edge, the worker and batch jobs all speak, in one room below the three.

Requests: the bodies (:mod:`~streams.wire.bodies`), their parse (:mod:`~streams.wire.parse`) and build
(:mod:`~streams.wire.build`) stages, the error shapes (:mod:`~streams.wire.errors`). The model's side: the
chat-template rendering (:mod:`~streams.wire.chat_template`) and the tool-call tags (:mod:`~streams.wire.tool_calls`).
Answers: logprobs (:mod:`~streams.wire.logprobs`) and the answer (:mod:`~streams.wire.answers`), typed by the answer
models the routes declare as their ``response_model``: completions (:mod:`~streams.wire.completion_models`), their
streamed chunks (:mod:`~streams.wire.chunk_models`), errors and model cards (:mod:`~streams.wire.api_models`), the
Responses API (:mod:`~streams.wire.response_models`), batches (:mod:`~streams.wire.batch_models`) and vector stores
(:mod:`~streams.wire.vector_store_models`). It imports no service's room (only ``config`` and ``rag``'s filter check
and citations), so each service may import it.
"""
