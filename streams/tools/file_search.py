"""The file_search executor: a search of the calling tenant's vector stores through the rag service's retriever.

The rag service is the only process that opens the index, so the runner asks it over the bus like the edge and the
CLI do (:class:`streams.rag.client.RagClient`: a search request on the retrieval topic, the answer on a reply topic of
this runner's own). The stores searched are the call's ``vector_store_ids`` or, when it names none, the tool's
configured ones; every one must exist (``not_found``) and belong to the intent's tenant (``permission_denied``),
checked here against the vector-stores table before anything is asked, so the call gets the precise tool error
(the retriever checks the tenant too, and refuses another tenant's store as unknown). The whole call (opening the
bus session on the first call, the checks, the answer) fits in the tool's ``timeout_s``; a retriever that does not answer in time is a ``timeout``
result, and the runner goes on with its next intent.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from aiokafka.errors import KafkaError
from pydantic import ValidationError

from schemas.retrieval import FileSearch, Passage
from schemas.tools import ToolError, ToolErrorCode
from streams.config import Settings
from streams.config.tools import ToolSettings
from streams.rag.client import RagClient, RagError, RagTimeout
from streams.tools.executors import ToolOutcome


class FileSearcher:
    """Runs the file_search calls of one runner; its bus session opens on the first call (a runner that is never
    asked to search follows no vector-stores table and makes no reply topic) and closes with the runner."""

    def __init__(self, settings: Settings, runner_id: str) -> None:
        self.settings = settings
        self.reply_name = f"tool-runner-{runner_id}"
        self._stack = contextlib.AsyncExitStack()
        self._opening: asyncio.Task[RagClient] | None = None

    async def run(self, tool: ToolSettings, arguments: dict[str, Any], tenant: str, budget_s: float) -> ToolOutcome:
        search = search_of(tool, arguments, default_results=self.settings.rag.default_max_num_results)
        if isinstance(search, ToolError):
            return ToolOutcome(error=search)
        try:
            return await asyncio.wait_for(self._search(tool, search, tenant, budget_s), budget_s)
        except (TimeoutError, RagTimeout):
            return _error("timeout", f"the retriever did not answer within {budget_s:.3g} s (is `specstream rag` "
                          "running?)")
        except RagError as error:
            return _error("retrieval_failed", f"the retriever refused the search: {error}")
        except KafkaError as error:
            return _error("retrieval_failed", f"the bus failed: {type(error).__name__}: {error}")

    async def _search(self, tool: ToolSettings, search: FileSearch, tenant: str, budget_s: float) -> ToolOutcome:
        # Shielded: a call that times out while the session opens must not cancel it half-way (a started consumer
        # would leak); the next call finds it open.
        client = await asyncio.shield(self._client())
        refused = await _refusal(client, search.vector_store_ids, tenant)
        if refused is not None:
            return ToolOutcome(error=refused)
        answer = await client.search(search.vector_store_ids, tenant=tenant, query=search.query,
                                     max_num_results=search.max_num_results, timeout_s=budget_s)
        output, truncated = results_output(answer.passages, tool.max_output_bytes)
        return ToolOutcome(output=output, truncated=truncated)

    def _client(self) -> asyncio.Task[RagClient]:
        opening = self._opening
        if opening is None or (opening.done() and (opening.cancelled() or opening.exception() is not None)):
            self._opening = asyncio.create_task(self._open(), name="file-search-session")
        assert self._opening is not None
        return self._opening

    async def _open(self) -> RagClient:
        session = RagClient.session(self.settings.kafka, self.settings.catalog, name=self.reply_name,
                                    client_id="specstream-tool-runner", documents=False)
        return await self._stack.enter_async_context(session)

    async def close(self) -> None:
        if self._opening is not None and not self._opening.done():
            self._opening.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._opening
        await self._stack.aclose()


def search_of(tool: ToolSettings, arguments: dict[str, Any], *, default_results: int = 4) -> FileSearch | ToolError:
    """What the call searches. The shipped schema already shapes the arguments, but an operator's schema for a
    file_search tool may not: whatever passed it is checked here again, so a bad value is a ``rejected`` result
    rather than a crashed call."""
    stores = arguments.get("vector_store_ids") or tool.vector_store_ids
    if not stores:
        return ToolError(code="rejected", message="file_search needs a vector store: the call names none "
                         "(vector_store_ids) and the tool configures none")
    query = arguments.get("query")
    if not isinstance(query, str) or not query.strip():
        return ToolError(code="rejected", message="arguments of file_search fail at query: a non-empty string is "
                         "required")
    try:
        return FileSearch(vector_store_ids=stores, query=query,
                          max_num_results=arguments.get("max_num_results", default_results))
    except ValidationError as error:
        first = error.errors()[0]
        where = "/".join(str(p) for p in first["loc"]) or "(the arguments)"
        return ToolError(code="rejected", message=f"arguments of file_search fail at {where}: {first['msg']}")


async def _refusal(client: RagClient, stores: list[str], tenant: str) -> ToolError | None:
    # A store not in the table yet may have been created a moment ago: only then is it worth a round trip.
    if any(client.stores.get(store) is None for store in stores):
        await client.stores.caught_up()
    for store in stores:
        record = client.stores.get(store)
        if record is None:
            return ToolError(code="not_found", message=f"no vector store with id {store!r}")
        if record.tenant != tenant:
            return ToolError(code="permission_denied",
                             message=f"tenant {tenant!r} may not search vector store {store!r}: it is not its own")
    return None


def results_output(passages: list[Passage], limit: int) -> tuple[dict[str, Any], bool]:
    """``{"results": [...]}`` best first, as OpenAI's file_search results, within ``limit`` bytes of JSON: the
    lowest-scoring results are dropped first, and a first result that alone is too large has its text cut."""
    results: list[dict[str, Any]] = []
    for passage in passages:
        result = {"file_id": passage.file_id, "filename": passage.filename, "vector_store_id": passage.vector_store_id,
                  "score": round(passage.score, 6), "text": passage.text, "attributes": dict(passage.attributes)}
        if _size(results + [result]) <= limit:
            results.append(result)
            continue
        if not results:
            cut = _cut_to_fit(result, limit)
            results += [cut] if cut is not None else []
        return {"results": results}, True
    return {"results": results}, False


def _cut_to_fit(result: dict[str, Any], limit: int) -> dict[str, Any] | None:
    text = result["text"]
    while text:
        excess = _size([{**result, "text": text}]) - limit
        if excess <= 0:
            return {**result, "text": text}
        # The excess is in bytes of JSON: cut as many bytes of the text's UTF-8 (a character split there is dropped).
        encoded = text.encode()
        text = encoded[:max(0, len(encoded) - excess)].decode(errors="ignore")
    return None  # not even its file's name fits


def _size(results: list[dict[str, Any]]) -> int:
    return len(json.dumps({"results": results}, ensure_ascii=False).encode())


def _error(code: ToolErrorCode, message: str) -> ToolOutcome:
    return ToolOutcome(error=ToolError(code=code, message=message))
