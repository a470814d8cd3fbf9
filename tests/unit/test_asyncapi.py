"""The bus documents itself: the AsyncAPI document names every topic of the catalog, with its key and its events."""
from __future__ import annotations

from pathlib import Path

from streams.asyncapi import document, document_yaml
from streams.config import Settings

REPO = Path(__file__).resolve().parents[2]


def test_the_document_lists_every_topic_of_the_catalog_with_its_key_and_a_described_payload() -> None:
    settings = Settings()
    spec = document(settings)
    channels = spec["channels"]
    addresses = {channel["address"]: channel for channel in channels.values()}
    catalog = settings.catalog
    for topic in [*catalog.shared_topics(), catalog.replies("<edge-id>")]:
        assert topic.name in addresses, f"{topic.name} is not documented"
        assert f"Key: {topic.key}." in addresses[topic.name]["description"]
    request = spec["components"]["schemas"]["GenerateRequest"]
    assert request["properties"]["request_id"]["description"] == "Client-unique id; every reply event carries it."
    assert {"TokenChunk", "Completion", "ErrorEvent", "DeadLetter", "ServiceAnnouncement", "CancelRequest",
            "EdgeAnnouncement"} <= spec["components"]["schemas"].keys()


def test_the_committed_document_is_the_generated_one() -> None:
    assert (REPO / "docs" / "asyncapi.yaml").read_text() == document_yaml(Settings()), \
        "regenerate: specstream topics asyncapi > docs/asyncapi.yaml"
