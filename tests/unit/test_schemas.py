"""The event schemas are the contract on the bus: they reject what they do not know, naming the field."""
import json

import pytest
from pydantic import ValidationError

from schemas import Completion, GenerateRequest, TokenChunk
from schemas.topics import TopicCatalog


def _request(**overrides) -> dict:
    body = {"request_id": "r1", "prompt": "hi", "model": "m", "reply_to": {"topic": "replies"}}
    body.update(overrides)
    return body


def _error_fields(exc: ValidationError) -> list[str]:
    return [".".join(str(p) for p in e["loc"]) for e in exc.errors()]


def test_request_round_trips_through_json():
    req = GenerateRequest.model_validate(_request(sampling={"seed": 7, "stop": ["\n"]}))
    again = GenerateRequest.model_validate_json(req.model_dump_json())
    assert again == req
    assert again.schema_version == 1


def test_unknown_field_is_rejected_naming_it():
    with pytest.raises(ValidationError) as err:
        GenerateRequest.model_validate(_request(temprature=0.5))
    assert _error_fields(err.value) == ["temprature"]


def test_nested_wrong_type_names_the_path():
    with pytest.raises(ValidationError) as err:
        GenerateRequest.model_validate(_request(sampling={"max_tokens": "many"}))
    assert _error_fields(err.value) == ["sampling.max_tokens"]


def test_unknown_schema_version_is_rejected():
    with pytest.raises(ValidationError) as err:
        GenerateRequest.model_validate(_request(schema_version=2))
    assert _error_fields(err.value) == ["schema_version"]


@pytest.mark.parametrize("inputs", [{}, {"messages": [{"role": "user", "content": "x"}]}])
def test_a_request_needs_exactly_one_of_prompt_and_messages(inputs):
    body = _request(**inputs)
    if not inputs:
        body.pop("prompt")
    with pytest.raises(ValidationError, match="exactly one of 'prompt' and 'messages'"):
        GenerateRequest.model_validate(body)


def test_every_event_documents_an_example_that_validates():
    for model in (GenerateRequest, TokenChunk, Completion):
        for example in model.model_json_schema()["examples"]:
            model.model_validate(example)


def test_catalog_names_derive_from_one_prefix():
    catalog = TopicCatalog(prefix="acme")
    names = [t.name for t in catalog.shared_topics()] + [catalog.replies("edge-1").name]
    assert all(n.startswith("acme.") for n in names)
    assert len(set(names)) == len(names)
    assert json.loads(json.dumps(catalog.services.config(min_insync_replicas=2)))["cleanup.policy"] == "compact"


def test_the_wire_carries_exactly_the_finish_reasons_the_engine_reports():
    from typing import get_args

    from engine.outputs import FinishReason as EngineFinishReason
    from schemas.events import FinishReason

    # The engine cannot import schemas (it runs without the bus), so its literal is checked here instead.
    assert get_args(EngineFinishReason) == get_args(FinishReason)
    assert Completion.model_fields["finish_reason"].annotation == FinishReason
