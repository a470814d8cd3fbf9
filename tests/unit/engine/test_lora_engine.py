"""LoRA adapters through the whole LLMEngine on a tiny model: HF + PEFT's output, mixed batches with speculation,
eviction and reload, unloading with requests in flight."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _engine_factories import TruthProposer, make_engine, random_prompts, single_thread, tiny_hf_model  # noqa: F401

from engine.config import LoRAConfig, SpeculationConfig
from engine.request import EngineRequest, RequestRejected, SamplingOptions
from engine.speculative.controller import SpeculationController
from tests.lora_support import peft_greedy, save_random_adapter

pytestmark = pytest.mark.usefixtures("single_thread")
DRAFTS = SpeculationConfig(enabled=True, max_draft_tokens=4, adaptive=False)  # drafts from the test's proposer
SUFFIX = SpeculationConfig(enabled=True, method="suffix", max_draft_tokens=4, adaptive=False)
PROMPTS = random_prompts([9, 14, 5, 11], seed=5)
PROMPTS[1] = PROMPTS[1][:5] * 3  # repetitive: the suffix proposer drafts from it


@pytest.fixture(scope="module")
def hf() -> Any:
    return tiny_hf_model("llama")


@pytest.fixture(scope="module")
def adapters(hf: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lora")
    return {
        "all": save_random_adapter(hf, root / "all", r=4, alpha=8, seed=1),
        "attn": save_random_adapter(hf, root / "attn", r=2, alpha=4, targets=["q_proj", "v_proj"], seed=2),
        "rs": save_random_adapter(hf, root / "rs", r=8, alpha=4, targets=["k_proj", "up_proj", "down_proj"],
                                  rslora=True, seed=3),
    }


def _engine(hf: Any, adapters: dict[str, Path], **kw: Any) -> Any:
    lora = LoRAConfig(adapters={n: str(p) for n, p in adapters.items()}, max_loaded=kw.pop("max_loaded", 4))
    return make_engine(hf, lora=lora, **kw)


def _req(rid: str, prompt: list[int], lora: str | None, n: int = 12, **sampling: Any) -> EngineRequest:
    return EngineRequest(rid, prompt, SamplingOptions(max_tokens=n, ignore_eos=True, **sampling), lora=lora)


def test_greedy_output_with_an_adapter_equals_hf_peft(hf: Any, adapters: dict[str, Path]) -> None:
    engine = _engine(hf, adapters)
    for name, folder in adapters.items():
        got = engine.generate([_req("r", PROMPTS[0], name)])["r"].token_ids
        assert got == peft_greedy(folder, hf, PROMPTS[0], 12), name
    base = engine.generate([_req("b", PROMPTS[0], None)])["b"].token_ids
    assert base != engine.generate([_req("a", PROMPTS[0], "all")])["a"].token_ids  # the adapter changes the text


# The delta is added to prepacked and quantized linears alike, each row's on its own adapter's weights in a fixed
# order (engine/fused/lora_delta.h). With int4/int8 weights every step then rounds a row as it does alone: the raw
# logprobs are equal bit for bit, not only the tokens. int4 was a strict xfail while the delta ran on torch's fp32
# GEMMs, which round a row by the batch's shape (adapter rows' logprobs differed in the last bits in int4 and int8
# alike; the tiny model's tokens held, and the n-gram proposer this test had never drafted from int4's text).
# fp32's prepacked linears pick their kernel by row count: tokens only.
@pytest.mark.parametrize("weights", ["fp32", "int8", "int4"])
def test_mixed_batch_with_speculation_gives_each_request_its_output_alone(
    hf: Any, adapters: dict[str, Path], weights: str
) -> None:
    # int4/int8 without the bf16 copy for wide steps: every step then runs the one row-count invariant kernel, the
    # configuration where a batch promises each request its text alone (engine/quant/linear.py).
    plain = _engine(hf, adapters, weights=weights, prepack_weights=weights == "fp32")
    names = [None, "all", "attn", "rs"]
    jobs = [(f"r{i}", PROMPTS[i % 4], names[i % 4], {"temperature": 0.8, "seed": i} if i % 3 == 0 else {})
            for i in range(8)]
    alone = {rid: plain.generate([_req(rid, p, n, logprobs=2, **s)])[rid] for rid, p, n, s in jobs}
    # Drafts of each request's own text, every third one corrupted: accepted and rejected rows in every format (the
    # n-gram proposer drafts only where a model's text repeats a token, which the int4 text here never did).
    proposer = TruthProposer({rid: out.token_ids for rid, out in alone.items()}, {rid: len(p) for rid, p, _, _ in jobs})
    controller = SpeculationController(SpeculationConfig(max_draft_tokens=4, adaptive=False))
    mixed = _engine(hf, adapters, weights=weights, prepack_weights=weights == "fp32", speculation=DRAFTS,
                    proposer=proposer, controller=controller).generate(
        [_req(rid, p, n, logprobs=2, **s) for rid, p, n, s in jobs])
    assert {rid: out.token_ids for rid, out in mixed.items()} == {rid: out.token_ids for rid, out in alone.items()}
    assert sum(out.spec.accepted for out in mixed.values()) > 0  # speculation did run, drafts were accepted
    assert sum(out.spec.drafted - out.spec.accepted for out in mixed.values()) > 0  # ... and rejected
    if weights != "fp32":
        assert {rid: _logprobs(out) for rid, out in mixed.items()} == {rid: _logprobs(o) for rid, o in alone.items()}


def _logprobs(out: Any) -> list[float]:
    return [entry.logprob for entry in out.logprobs]


def test_suffix_decoding_from_other_adapters_outputs_gives_each_request_its_output_alone(
    hf: Any, adapters: dict[str, Path]
) -> None:
    """The same mixed batch twice on one engine: the second round drafts from the first round's outputs, whatever
    adapter wrote them, and each request's text is still its own."""
    plain = _engine(hf, adapters)
    names = [None, "all", "attn", "rs"]
    jobs = [(i, PROMPTS[i % 4], names[i % 4], {"temperature": 0.8, "seed": i} if i % 3 == 0 else {}) for i in range(8)]
    alone = {i: plain.generate([_req("r", p, n, **s)])["r"].token_ids for i, p, n, s in jobs}
    engine = _engine(hf, adapters, speculation=SUFFIX)
    for tag in ("first", "again"):
        mixed = engine.generate([_req(f"{tag}{i}", p, n, **s) for i, p, n, s in jobs])
        assert {i: mixed[f"{tag}{i}"].token_ids for i, _, _, _ in jobs} == alone
    drafted, accepted = sum(o.spec.drafted for o in mixed.values()), sum(o.spec.accepted for o in mixed.values())
    assert accepted >= 0.8 * drafted > 0  # the second round drafted from the first's outputs


def test_least_recently_used_adapter_is_evicted_and_read_again_on_demand(hf: Any, adapters: dict[str, Path]) -> None:
    engine = _engine(hf, adapters, max_loaded=1)
    manager = engine.lora.manager
    assert list(manager.slots) == ["all"]  # only max_loaded adapters load at start
    want = {n: peft_greedy(adapters[n], hf, PROMPTS[2], 8) for n in adapters}
    # All three at once with one slot: they take turns, each waiting for the previous one's requests to end.
    out = engine.generate([_req(n, PROMPTS[2], n, 8) for n in adapters])
    assert {n: o.token_ids for n, o in out.items()} == want
    assert len(manager.slots) == 1 and not engine.lora.parked


def test_unknown_adapter_is_refused_naming_the_served_models(hf: Any, adapters: dict[str, Path]) -> None:
    engine = _engine(hf, adapters)
    with pytest.raises(RequestRejected, match="'nope' is not served; available: tiny, all, attn, rs") as info:
        engine.add_request(_req("x", PROMPTS[0], "nope"))
    assert info.value.code == "unknown_model"
    with pytest.raises(RequestRejected, match="not served"):
        make_engine(hf).add_request(_req("y", PROMPTS[0], "all"))  # LoRA off altogether


def test_unloading_lets_requests_in_flight_finish_and_refuses_new_ones(hf: Any, adapters: dict[str, Path]) -> None:
    engine = _engine(hf, adapters)
    want = engine.generate([_req("ref", PROMPTS[3], "attn")])["ref"].token_ids
    engine.add_request(_req("r", PROMPTS[3], "attn"))
    tokens: list[int] = []
    for out in engine.step():
        tokens += out.token_ids
    assert engine.lora.manager.unregister("attn")
    with pytest.raises(RequestRejected, match="not served"):
        engine.add_request(_req("late", PROMPTS[3], "attn"))
    while engine.has_unfinished():
        for out in engine.step():
            tokens += out.token_ids
    assert tokens == want
    assert "attn" not in engine.lora.manager.slots  # its slot is free once the last request ended


def test_a_failed_reload_fails_the_waiting_request_and_keeps_serving(
    hf: Any, adapters: dict[str, Path], tmp_path: Path
) -> None:
    engine = _engine(hf, {"all": adapters["all"]}, max_loaded=1)
    engine.lora.manager.register("gone", str(tmp_path / "missing"))
    engine.add_request(_req("g", PROMPTS[0], "gone"))
    engine.add_request(_req("ok", PROMPTS[0], None, 4))
    outs: dict[str, list[Any]] = {"g": [], "ok": []}
    while engine.has_unfinished():
        for out in engine.step():
            outs[out.request_id].append(out)
    failed = outs["g"][-1]
    assert failed.finished and failed.error is not None and failed.error[0] == "internal_error"
    assert "is not a directory" in failed.error[1]
    assert sum(len(o.token_ids) for o in outs["ok"]) == 4


def test_replacing_an_adapter_keeps_requests_in_flight_on_the_weights_they_started_with(
    hf: Any, adapters: dict[str, Path]
) -> None:
    engine = _engine(hf, {"x": adapters["all"]}, max_loaded=2)
    want = {"old": peft_greedy(adapters["all"], hf, PROMPTS[1], 8), "new": peft_greedy(adapters["rs"], hf, PROMPTS[1], 8)}
    engine.add_request(_req("old", PROMPTS[1], "x", 8))
    got: dict[str, list[int]] = {"old": [], "new": []}
    for out in engine.step():
        got[out.request_id] += out.token_ids
    engine.lora.manager.register("x", str(adapters["rs"]))  # a load in place from another folder
    engine.add_request(_req("new", PROMPTS[1], "x", 8))
    while engine.has_unfinished():
        for out in engine.step():
            got[out.request_id] += out.token_ids
    assert got == want
