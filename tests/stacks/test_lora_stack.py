"""LoRA adapters through the whole stack (real broker, real default model, worker and edge processes).

"pirate" is trained here with PEFT for a few steps on one sentence, so its greedy text visibly differs from the
base model's; through the edge it must equal HF + PEFT's. "poet" is random (training costs minutes on a busy
2-core machine, and mixing only needs an adapter that changes the text)."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from engine.config import DEFAULT_MODEL
from streams.testing.stack import REPO, Stack, running_stack, spawn_process
from tests.edge_support import WORKER_ENV
from tests.kafka_fixtures import kafka_bootstrap  # noqa: F401 - fixture
from tests.lora_support import peft_greedy, save_random_adapter, train_adapter

pytestmark = [pytest.mark.kafka, pytest.mark.model, pytest.mark.timeout(1200)]
PIRATE = "Arr matey, the treasure lies buried on Skull Island under the old palm tree."


@pytest.fixture(scope="session")
def smol() -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.loader import resolve_model_dir

    folder = resolve_model_dir(DEFAULT_MODEL)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="session")
def adapters(smol: tuple[Any, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    hf, tok = smol
    root = tmp_path_factory.mktemp("smol-lora")
    return {
        "pirate": train_adapter(hf, tok, root / "pirate", PIRATE, steps=8, seed=1, r=8),
        "poet": save_random_adapter(hf, root / "poet", std=0.05, r=4, targets=["q_proj", "v_proj", "down_proj"]),
        "big": save_random_adapter(hf, root / "big", r=32, targets=["q_proj"]),
        "dora": save_random_adapter(hf, root / "dora", r=4, targets=["q_proj"], dora=True),
    }


@pytest.fixture(scope="module")
def stack(kafka_bootstrap: str, adapters: dict[str, Path]) -> Iterator[Stack]:  # noqa: F811
    # fp32: answers are compared with HF + PEFT's (int4's would round otherwise).
    env = {**WORKER_ENV, "SPECSTREAM_ENGINE__WEIGHTS": "fp32",
           "SPECSTREAM_ENGINE__LORA__ADAPTERS": json.dumps({"pirate": str(adapters["pirate"])}),
           "SPECSTREAM_ENGINE__LORA__RUNTIME_UPDATES": "true"}
    with running_stack(kafka_bootstrap, env=env) as running:
        yield running


def complete(stack: Stack, model: str, prompt: str, **extra: Any) -> httpx.Response:
    body = {"model": model, "prompt": prompt, "max_tokens": 16, "temperature": 0, **extra}
    return httpx.post(stack.base_url + "/v1/completions", json=body, headers=stack.headers, timeout=300)


async def acomplete(client: httpx.AsyncClient, stack: Stack, model: str, prompt: str, **extra: Any) -> str:
    body = {"model": model, "prompt": prompt, "max_tokens": 16, "temperature": 0, **extra}
    response = await client.post(stack.base_url + "/v1/completions", json=body, headers=stack.headers, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def lora(stack: Stack, route: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{stack.base_url}/v1/{route}_lora_adapter", json=body, headers=stack.headers, timeout=120)


def models(stack: Stack) -> dict[str, Any]:
    listed = httpx.get(stack.base_url + "/v1/models", headers=stack.headers, timeout=30).json()["data"]
    return {card["id"]: card["parent"] for card in listed}


def test_a_configured_adapter_is_a_model_whose_parent_is_the_base(stack: Stack) -> None:
    assert models(stack) == {DEFAULT_MODEL: None, "pirate": DEFAULT_MODEL}
    missing = complete(stack, "sailor", "Hi")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    assert f"Served models: {DEFAULT_MODEL}, pirate." in missing.json()["error"]["message"]


def test_greedy_text_with_the_adapter_equals_hf_peft(stack: Stack, smol: tuple[Any, Any],
                                                    adapters: dict[str, Path]) -> None:
    hf, tok = smol
    prompt = "Arr matey, the treasure"
    ids = tok(prompt)["input_ids"]
    want = tok.decode(peft_greedy(adapters["pirate"], hf, ids, 16, eos_token_id=[tok.eos_token_id]),
                      skip_special_tokens=True)
    got = complete(stack, "pirate", prompt)
    assert got.status_code == 200, got.text
    assert got.json()["choices"][0]["text"] == want
    assert got.json()["model"] == "pirate"
    base = complete(stack, DEFAULT_MODEL, prompt).json()["choices"][0]["text"]
    assert base != want  # the adapter visibly changes the text


def test_loading_while_a_request_streams_then_a_mixed_batch_matches_each_request_alone(
    stack: Stack, adapters: dict[str, Path]
) -> None:
    async def scenario() -> None:
        async with httpx.AsyncClient() as client:
            story = ("Once upon a time, in a village by the sea,", {"max_tokens": 48})
            streaming = asyncio.create_task(acomplete(client, stack, DEFAULT_MODEL, story[0], **story[1]))
            await asyncio.sleep(0.5)
            loaded = await asyncio.to_thread(lora, stack, "load", lora_name="poet", lora_path=str(adapters["poet"]))
            assert loaded.status_code == 200 and loaded.text == "Success: LoRA adapter 'poet' added successfully."
            # The request that ran across the load got what it gets alone (greedy).
            assert await streaming == await acomplete(client, stack, DEFAULT_MODEL, story[0], **story[1])
            names = [DEFAULT_MODEL, "pirate", "poet"]
            jobs = [(names[i % 3], ["Roses are", "Arr matey,", "The ocean is", "Once upon a"][i % 4],
                     {"temperature": 0.8, "seed": i} if i % 4 == 3 else {}) for i in range(8)]
            alone = [await acomplete(client, stack, m, p, **kw) for m, p, kw in jobs]
            together = await asyncio.gather(*(acomplete(client, stack, m, p, **kw) for m, p, kw in jobs))
            assert list(together) == alone

    asyncio.run(scenario())
    assert models(stack)["poet"] == DEFAULT_MODEL


@pytest.mark.parametrize(("which", "message"), [
    ("missing", "is not a directory"),
    ("dora", "DoRA adapters (use_dora: true) are not supported"),
    ("big", "rank 32 exceeds max_rank 16"),
])
def test_a_load_that_fails_says_why_and_the_worker_keeps_serving(
    stack: Stack, adapters: dict[str, Path], which: str, message: str, tmp_path: Path
) -> None:
    path = str(tmp_path / "nowhere") if which == "missing" else str(adapters[which])
    failed = lora(stack, "load", lora_name=f"bad-{which}", lora_path=path)
    assert failed.status_code == 400, failed.text
    assert failed.json()["error"]["code"] == "lora_load_failed" and message in failed.json()["error"]["message"]
    assert f"bad-{which}" not in models(stack)
    assert complete(stack, "pirate", "Arr").status_code == 200


def test_bad_registry_calls_get_vllm_errors(stack: Stack, adapters: dict[str, Path]) -> None:
    again = lora(stack, "load", lora_name="pirate", lora_path=str(adapters["pirate"]))
    assert again.status_code == 400 and again.json()["error"]["message"] == (
        "The lora adapter 'pirate' has already been loaded.")
    unknown = lora(stack, "unload", lora_name="nobody")
    assert unknown.status_code == 404 and unknown.json()["error"]["message"] == (
        "The lora adapter 'nobody' cannot be found.")
    no_path = lora(stack, "load", lora_name="x")
    assert no_path.status_code == 400 and no_path.json()["error"]["param"] == "lora_path"
    base = lora(stack, "load", lora_name=DEFAULT_MODEL, lora_path="/x")
    assert base.status_code == 400 and "base model" in base.json()["error"]["message"]


def test_unloading_lets_a_streaming_request_finish_then_refuses_the_adapter(stack: Stack) -> None:
    async def scenario() -> tuple[str, httpx.Response]:
        async with httpx.AsyncClient() as client:
            want = await acomplete(client, stack, "poet", "Roses are", max_tokens=40)
            running = asyncio.create_task(acomplete(client, stack, "poet", "Roses are", max_tokens=40))
            await asyncio.sleep(1.0)
            unloaded = await asyncio.to_thread(lora, stack, "unload", lora_name="poet")
            assert await running == want
            return want, unloaded

    _, unloaded = asyncio.run(scenario())
    assert unloaded.status_code == 200 and unloaded.text == "Success: LoRA adapter 'poet' removed successfully."
    assert "poet" not in models(stack)
    assert complete(stack, "poet", "Roses").status_code == 404


def cli(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "streams.cli", "adapters", *args], env=stack.env, cwd=REPO,
                          capture_output=True, text=True, timeout=180, check=False)


def test_the_cli_loads_lists_and_unloads_through_the_topic(stack: Stack, adapters: dict[str, Path]) -> None:
    assert cli(stack, "load", "bad name", "/x").returncode == 2
    loaded = cli(stack, "load", "poet-cli", str(adapters["poet"]), "--wait", "60s")
    assert loaded.returncode == 0, loaded.stderr
    assert models(stack).get("poet-cli") == DEFAULT_MODEL
    listed = json.loads(cli(stack, "list", "--json").stdout)
    row = next(r for r in listed if r["name"] == "poet-cli")
    assert row["registry"] == "load" and row["path"] == str(adapters["poet"]) and len(row["workers"]) == 1
    failed = cli(stack, "load", "dora-cli", str(adapters["dora"]), "--wait", "60s")
    assert failed.returncode == 1 and "DoRA" in failed.stderr
    assert cli(stack, "unload", "poet-cli", "--wait", "60s").returncode == 0
    assert "poet-cli" not in models(stack)


def test_a_worker_started_after_a_load_serves_the_adapter(stack: Stack, adapters: dict[str, Path]) -> None:
    assert lora(stack, "load", lora_name="poet", lora_path=str(adapters["poet"])).status_code == 200
    want = complete(stack, "poet", "Roses are").json()["choices"][0]["text"]
    second = spawn_process("worker-2", ["worker"], stack.env, Path(stack.processes[0].log).parent)
    stack.processes.insert(1, second)  # stopped with the stack, before the edge
    first = stack.processes[0]
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:  # the second worker announces itself with poet, then the first one stops
        ready = httpx.get(stack.base_url + "/readyz", timeout=5).json()
        if len(ready.get("workers", [])) == 2:
            break
        stack.check_alive()
        time.sleep(1.0)
    first.popen.terminate()
    first.popen.wait(60)
    stack.processes.remove(first)
    deadline = time.monotonic() + 60
    while len(httpx.get(stack.base_url + "/readyz", timeout=5).json().get("workers", [])) != 1:
        assert time.monotonic() < deadline, "the first worker never left"
        time.sleep(0.5)
    while models(stack) != {DEFAULT_MODEL: None, "pirate": DEFAULT_MODEL, "poet": DEFAULT_MODEL}:
        assert time.monotonic() < deadline, f"the second worker does not announce poet: {models(stack)}"
        time.sleep(0.5)
    assert complete(stack, "poet", "Roses are").json()["choices"][0]["text"] == want
