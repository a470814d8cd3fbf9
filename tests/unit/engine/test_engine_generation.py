"""The engine end to end on tiny random models: exactness against HF generate,
speculation plumbing and KV rollback, memory admission, abort, deadlines, finish reasons."""
from __future__ import annotations

import time

import pytest
import torch
from _engine_factories import (  # noqa: F401  (every_format_runs: a fixture)
    every_format_runs,
    greedy_request,
    hf_greedy,
    make_engine,
    needs_bf16_gemm,
    random_prompts,
    tiny_hf_model,
)

from engine.config import LoRAConfig, SpeculationConfig
from engine.lora.manager import LoRAManager
from engine.model import UnsupportedModelError
from engine.request import EngineRequest, RequestRejected, SamplingOptions
from engine.speculative.controller import SpeculationController
from engine.speculative.proposer import DraftProposal, ProposalInput

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def llama():
    return tiny_hf_model("llama")


def drain(engine, outputs: dict[str, list[int]]) -> None:
    while engine.has_unfinished():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).extend(out.token_ids)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "mistral", "phi3", "mixtral"])
def test_staggered_batch_equals_hf_generate_per_prompt(kind: str) -> None:
    hf = tiny_hf_model(kind)
    # 8 tokens per step: long prompts are prefilled in chunks next to running decodes.
    engine = make_engine(hf, max_batched_tokens=8)
    prompts = random_prompts([5, 19, 3, 26, 11])
    new = [12, 7, 15, 9, 10]
    got: dict[str, list[int]] = {}
    for i in (0, 1):
        engine.add_request(greedy_request(f"r{i}", prompts[i], new[i]))
    for _ in range(3):
        for out in engine.step():
            got.setdefault(out.request_id, []).extend(out.token_ids)
    engine.add_request(greedy_request("r2", prompts[2], new[2]))
    engine.add_request(greedy_request("r3", prompts[3], new[3]))
    for _ in range(2):
        for out in engine.step():
            got.setdefault(out.request_id, []).extend(out.token_ids)
    engine.add_request(greedy_request("r4", prompts[4], new[4]))
    drain(engine, got)
    for i, prompt in enumerate(prompts):
        assert got[f"r{i}"] == hf_greedy(hf, prompt, new[i]), f"r{i}"
    assert engine.cache_usage().used_tokens == 0


@pytest.mark.usefixtures("every_format_runs")
@pytest.mark.parametrize("kind,weights", [
    ("llama", "fp32"), ("qwen2", "fp32"), ("qwen3", "fp32"), ("qwen3", "int4"), ("mistral", "fp32"),
    ("phi3", "fp32"), ("phi3", "int4"), ("mixtral", "fp32"), ("mixtral", "int4"), ("mixtral", "int8"),
    pytest.param("mixtral", "bf16", marks=needs_bf16_gemm)])
def test_speculated_greedy_is_plain_greedy_and_in_fp32_hfs(kind: str, weights: str) -> None:
    # Every family; Phi-3's checkpoints come with q/k/v and gate/up fused; Mixtral routes each token to 2 of 4 experts. A
    # repetitive prompt makes the n-gram proposer draft, so verification steps run.
    hf = tiny_hf_model(kind)
    ngram = SpeculationConfig(enabled=True, method="ngram", max_draft_tokens=4, adaptive=False)
    engine = make_engine(hf, weights=weights, speculation=ngram)
    prompt = random_prompts([12], seed=3)[0] * 3
    params = SamplingOptions(max_tokens=24, temperature=0.0, ignore_eos=True)
    speculated = engine.generate([EngineRequest("s", prompt, params)])["s"]
    plain = engine.generate([EngineRequest("p", prompt, params, speculation=False)])["p"]
    assert speculated.stats.spec.drafted > 0
    assert speculated.token_ids == plain.token_ids
    if weights == "fp32":
        assert plain.token_ids == hf_greedy(hf, prompt, 24)


@pytest.mark.usefixtures("every_format_runs")
@pytest.mark.parametrize("fmt", ["int4", "int8"])
def test_a_mixture_of_experts_quantizes_every_experts_projections_and_keeps_its_router_in_fp32(fmt: str) -> None:
    from engine.quant.linear import QuantizedLinear

    hf = tiny_hf_model("mixtral")
    engine = make_engine(hf, weights=fmt)
    moe = engine.model.layers[0].mlp
    assert engine.weight_format == fmt and len(moe.experts) == 4
    assert all(isinstance(lin, QuantizedLinear) for x in moe.experts for lin in (x.gate_up_proj, x.down_proj))
    assert moe.router.weight.dtype == torch.float32
    # int8 stays near fp32's logits (4 % here, as a dense model's); int4's error on random weights is too wide
    # to bound usefully, and its tokens are held to plain decoding's by the speculation test above.
    if fmt == "int8":
        from test_model_parity import cache_for, run_chunks

        ids = random_prompts([12], seed=4)[0]
        ref = run_chunks(make_engine(hf).model, cache_for(hf), [(0, ids, 0)])
        got = run_chunks(engine.model, cache_for(hf), [(0, ids, 0)])
        assert (got - ref).norm() / ref.norm() < 0.1


@pytest.mark.usefixtures("every_format_runs")
def test_a_mixture_of_experts_refuses_adapters_by_name_and_keeps_lora_off() -> None:
    # LoRA's slots (on by default) stay empty for it, and say so; an adapter configured for it is refused.
    lines: list[str] = []
    assert make_engine(tiny_hf_model("mixtral"), lora=LoRAConfig(adapters={}, max_loaded=2),
                       progress=lines.append).lora is None
    assert "lora: off (mixtral's experts take no adapters yet)" in lines
    with pytest.raises(UnsupportedModelError, match="mixtral: LoRA adapters are not served .* engine.lora.adapters"):
        LoRAManager(make_engine(tiny_hf_model("mixtral")).model, LoRAConfig(adapters={}, max_loaded=2))


class OracleProposer:
    """Drafts the true greedy continuation, corrupted at chosen draft positions, to exercise partial acceptance."""

    def __init__(self, truth: dict[str, list[int]], prompt_len: dict[str, int], wrong_every: int) -> None:
        self.truth, self.prompt_len, self.wrong_every = truth, prompt_len, wrong_every
        self.calls: dict[str, int] = {}
        self.rollbacks: list[tuple[str, int]] = []

    def propose(self, inputs: list[ProposalInput], num_tokens: list[int]) -> list[DraftProposal]:
        out = []
        for inp, k in zip(inputs, num_tokens):
            self.calls[inp.seq_id] = self.calls.get(inp.seq_id, 0) + 1
            pos = len(inp.token_ids) - self.prompt_len[inp.seq_id]
            drafts = list(self.truth[inp.seq_id][pos : pos + k])
            if self.calls[inp.seq_id] % self.wrong_every == 0 and len(drafts) > 1:
                drafts[1] = (drafts[1] + 1) % 300  # reject from the second draft on
            out.append(DraftProposal(drafts, None))
        return out

    def rollback(self, seq_id: str, num_tokens: int) -> None:
        self.rollbacks.append((seq_id, num_tokens))

    def release(self, seq_id: str) -> None:
        pass


def test_speculative_steps_emit_exactly_the_greedy_tokens(llama) -> None:
    prompts = random_prompts([7, 15, 4], seed=3)
    n_new = 20
    truth = {f"s{i}": hf_greedy(llama, p, n_new) for i, p in enumerate(prompts)}
    proposer = OracleProposer(truth, {f"s{i}": len(p) for i, p in enumerate(prompts)}, wrong_every=2)
    spec = SpeculationConfig(enabled=True, max_draft_tokens=4)
    controller = SpeculationController(SpeculationConfig(max_draft_tokens=4, adaptive=False))
    engine = make_engine(llama, speculation=spec, proposer=proposer, controller=controller, max_batched_tokens=12)
    res = engine.generate([greedy_request(f"s{i}", p, n_new) for i, p in enumerate(prompts)])
    for rid, r in res.items():
        assert r.token_ids == truth[rid]
        st = r.stats
        assert st is not None and st.spec.drafted > 0 and 0 < st.spec.accepted < st.spec.drafted
        assert st.tokens_per_forward > 1.0  # fewer target forwards than tokens
        assert st.spec.accepted_at[0] >= st.spec.accepted_at[-1] and len(st.spec.drafted_at) == 4
    assert engine.num_forwards < 3 * n_new
    assert engine.cache_usage().used_tokens == 0


def test_ngram_speculation_does_not_change_greedy_output(llama) -> None:
    # Repetitive prompts so the n-gram proposer finds matches.
    prompts = [[5, 6, 7, 8] * 6, [9, 10, 11] * 5 + [9]]
    plain = make_engine(llama).generate([greedy_request(f"p{i}", p, 24) for i, p in enumerate(prompts)])
    spec = SpeculationConfig(enabled=True, method="ngram", max_draft_tokens=3)
    controller = SpeculationController(SpeculationConfig(max_draft_tokens=3, adaptive=False))
    fast = make_engine(llama, speculation=spec, controller=controller)
    res = fast.generate([greedy_request(f"p{i}", p, 24) for i, p in enumerate(prompts)])
    for rid in res:
        assert res[rid].token_ids == plain[rid].token_ids
    assert sum(r.spec.drafted for r in res.values()) > 0


def test_rollback_of_draft_positions_equals_a_cache_built_from_scratch(llama) -> None:
    from engine.model import AttentionMetadata, SeqAttention, causal_mask_at_end

    engine = make_engine(llama)
    model, cache = engine.model, engine.kv_cache
    prompt = random_prompts([10], seed=5)[0]
    tail = [17, 23]  # committed after the prompt
    drafts = [40, 41, 42]

    def feed(slot, tokens: list[int]) -> torch.Tensor:
        start, n = slot.num_cached, len(tokens)
        r0 = slot.region.start
        mask = causal_mask_at_end(n, start + n, "cpu") if n > 1 else None
        attn = AttentionMetadata([SeqAttention(0, n, r0, start + n, mask)], torch.arange(r0 + start, r0 + start + n), cache)
        with torch.inference_mode():
            logits = model.compute_logits(model(torch.tensor(tokens), torch.arange(start, start + n), attn))
        slot.num_cached += n
        return logits[-1]

    a = cache.allocate(32)
    feed(a, prompt)
    feed(a, [tail[0], *drafts])  # a verify step: last token + 3 drafts, all rejected
    a.rollback(len(prompt) + 1)  # keep the fed token only: O(1)
    next_a = feed(a, [tail[1]])

    b = cache.allocate(32)
    next_b = feed(b, prompt + tail)  # no drafts ever written
    n = len(prompt) + 2
    assert a.num_cached == b.num_cached == n
    ka, va = cache.view(0, a.region.start, n)
    kb, vb = cache.view(0, b.region.start, n)
    torch.testing.assert_close(ka, kb, atol=1e-5, rtol=0)
    torch.testing.assert_close(va, vb, atol=1e-5, rtol=0)
    torch.testing.assert_close(next_a, next_b, atol=1e-4, rtol=0)


def test_six_requests_through_memory_for_two(llama) -> None:
    prompts = random_prompts([6, 9, 4, 8, 5, 7], seed=7)
    # Each request needs prompt + 8 + 1 slots (<= 18): 40 slots hold two at a time, never three.
    engine = make_engine(llama, kv_tokens=40)
    for i, p in enumerate(prompts):
        engine.add_request(greedy_request(f"m{i}", p, 8))
    got: dict[str, list[int]] = {}
    finished = set()
    max_running = 0
    while engine.has_unfinished():
        for out in engine.step():
            got.setdefault(out.request_id, []).extend(out.token_ids)
            if out.finished:
                finished.add(out.request_id)
                assert out.finish_reason == "length"
        max_running = max(max_running, engine.scheduler.num_running)
        assert engine.cache_usage().used_tokens <= 40
    assert max_running == 2
    assert finished == {f"m{i}" for i in range(6)}
    for i, p in enumerate(prompts):
        assert got[f"m{i}"] == hf_greedy(llama, p, 8)
    assert engine.cache_usage().used_tokens == 0 and engine.cache_usage().used_bytes == 0

    with pytest.raises(RequestRejected) as e:
        engine.add_request(greedy_request("huge", [i % 300 for i in range(500)], 100))
    assert e.value.code == "context_length_exceeded"
    assert e.value.message == (
        "prompt has 500 tokens and max_tokens is 100: 500+100 exceeds the model's context of 512 tokens"
    )
    with pytest.raises(RequestRejected, match="the whole KV cache holds 40 tokens"):
        engine.add_request(greedy_request("wide", list(range(30)), 30))
    with pytest.raises(RequestRejected, match="outside the vocabulary"):
        engine.add_request(greedy_request("bad", [1, 2, 300], 5))


def test_abort_mid_generation_frees_its_region_at_once(llama) -> None:
    engine = make_engine(llama)
    engine.add_request(greedy_request("keep", [1, 2, 3], 20))
    engine.add_request(greedy_request("drop", [4, 5, 6, 7], 20))
    for _ in range(3):
        engine.step()
    before = engine.cache_usage().used_tokens
    out = engine.abort("drop")
    assert out is not None and out.finished and out.finish_reason == "abort"
    assert out.stats is not None and out.stats.completion_tokens == 3
    assert engine.cache_usage().used_tokens == before - (4 + 20 + 1)
    assert engine.abort("drop") is None
    res: dict[str, list[int]] = {}
    drain(engine, res)
    assert "drop" not in res and len(res["keep"]) == 20 - 3


def test_an_expired_request_never_starts_and_one_expiring_mid_generation_stops_with_deadline(llama) -> None:
    engine = make_engine(llama)
    expired = greedy_request("late", [1, 2, 3], 10, deadline=time.time() - 1)
    running = greedy_request("slow", [4, 5, 6], 50)
    engine.add_request(expired)
    engine.add_request(running)
    outs = {o.request_id: o for o in engine.step()}
    late = outs["late"]
    assert late.finished and late.finish_reason == "deadline" and late.token_ids == []
    assert late.stats is not None and late.stats.completion_tokens == 0
    assert engine.scheduler.get("late") is None  # never started
    for _ in range(3):
        engine.step()
    running.deadline = time.time() - 0.001  # expires mid-generation
    outs = {o.request_id: o for o in engine.step()}
    assert outs["slow"].finish_reason == "deadline" and outs["slow"].stats.completion_tokens == 4
    assert not engine.has_unfinished() and engine.cache_usage().used_tokens == 0


def test_finish_reasons_eos_stop_string_and_length(llama) -> None:
    prompt = random_prompts([6], seed=11)[0]
    truth = hf_greedy(llama, prompt, 12)
    # EOS: the 4th generated token is declared EOS.
    engine = make_engine(llama, eos=frozenset({truth[3]}))
    first_eos = truth.index(truth[3])
    r = engine.generate([EngineRequest("e", prompt, SamplingOptions(max_tokens=12))])["e"]
    assert r.finish_reason == "stop" and r.token_ids == truth[: first_eos + 1]
    r = engine.generate([EngineRequest("i", prompt, SamplingOptions(max_tokens=12, ignore_eos=True))])["i"]
    assert r.finish_reason == "length" and r.token_ids == truth
    # Stop string: CharTokenizer renders token t as chr(97 + t % 26).
    text = "".join(chr(97 + t % 26) for t in truth)
    stop = text[5:7]
    cut = text.index(stop)
    r = make_engine(llama).generate([EngineRequest("s", prompt, SamplingOptions(max_tokens=12, stop=(stop,)))])["s"]
    assert r.finish_reason == "stop" and r.text == text[:cut] and r.token_ids == truth[: cut + 2]
    assert r.stats is not None and r.stats.prompt_tokens == 6 and r.stats.completion_tokens == cut + 2
    assert r.stats.ttft_s <= r.stats.total_s
