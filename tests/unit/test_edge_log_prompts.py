"""A tenant's `log_prompts: false` (keys file) keeps its prompts out of the completions log: the edge marks each of
its requests `log_prompt: false`, which the worker's record honours."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from streams.commands.keys import main as keys_main
from streams.config import Settings
from streams.edge.key_store import KeyStore
from streams.edge.keys import KeyStoreError, create_key, read_key_file
from streams.edge.settings import EdgeOptions
from streams.wire.bodies import ChatCompletionBody
from streams.wire.build import build_request
from streams.wire.parse import parse_body

BODY = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "my secret"}]}


def test_a_tenant_created_without_prompt_logging_gets_principals_that_say_so(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.json"
    private_key, _ = create_key(keys_file, "private", log_prompts=False)
    open_key, _ = create_key(keys_file, "open")
    store = KeyStore(keys_file)
    assert store.lookup(private_key).log_prompts is False  # type: ignore[union-attr]
    assert store.lookup(open_key).log_prompts is True  # type: ignore[union-attr]
    assert read_key_file(keys_file).tenants["private"] == {"log_prompts": False}


def test_log_prompts_must_be_a_boolean_in_the_keys_file(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(json.dumps({"version": 1, "keys": [], "tenants": {"alice": {"log_prompts": "no"}}}))
    with pytest.raises(KeyStoreError, match="tenants.alice.log_prompts must be true or false"):
        read_key_file(keys_file)


def test_the_edge_marks_requests_of_such_a_tenant_and_only_those() -> None:
    body = parse_body(ChatCompletionBody, BODY)
    assert build_request(body, EdgeOptions(Settings()), tenant="private", log_prompt=False).log_prompt is False
    assert build_request(body, EdgeOptions(Settings()), tenant="open").log_prompt is True


def test_keys_create_no_log_prompts_sets_the_tenant_and_keys_list_shows_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--config", os.devnull, "--file", str(tmp_path / "keys.json")]
    assert keys_main([*base, "create", "--tenant", "private", "--no-log-prompts"]) == 0
    assert keys_main([*base, "create", "--tenant", "open"]) == 0
    capsys.readouterr()
    assert keys_main([*base, "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [("[prompts not logged]" in line) for line in lines if " private " in line or " open " in line] == [
        True, False]
    assert keys_main([*base, "list", "--json"]) == 0
    assert [k["log_prompts"] for k in json.loads(capsys.readouterr().out)] == [False, True]
