"""Small builders shared by the engine-core tests: tiny random models, a toy
tokenizer, engines wired around them, HF references. No model files needed."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from engine import engine_setup
from engine.config import LoRAConfig, SpeculationConfig, embedded_engine_config
from engine.kv_cache import kv_bytes_per_token
from engine.llm_engine import LLMEngine
from engine.loader import LoadedModel
from engine.model import Decoder
from engine.quant import formats
from engine.request import EngineRequest, SamplingOptions
from engine.scheduler import Scheduler, SchedulerOutput
from engine.speculative.proposer import DraftProposal, ProposalInput

VOCAB = 300


class CharTokenizer:
    """Token i decodes to one letter; enough for engine tests (the detokenizer has its own, real-tokenizer tests)."""

    eos_token_id = None

    def decode(self, ids: list[int], skip_special_tokens: bool = True, **_: Any) -> str:
        return "".join(chr(ord("a") + i % 26) for i in ids)


def tiny_hf_model(kind: str = "llama", seed: int = 0, **overrides: Any) -> Any:
    """A random 2-layer GQA model of the given family, fp32, eval mode."""
    from transformers import (
        Gemma2Config,
        Gemma2ForCausalLM,
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        MixtralConfig,
        MixtralForCausalLM,
        Phi3Config,
        Phi3ForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    families = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
        "qwen3": (Qwen3Config, Qwen3ForCausalLM),
        "mistral": (MistralConfig, MistralForCausalLM),
        "phi3": (Phi3Config, Phi3ForCausalLM),
        "mixtral": (MixtralConfig, MixtralForCausalLM),
        "gemma2": (Gemma2Config, Gemma2ForCausalLM),
        "gemma3": (Gemma3TextConfig, Gemma3ForCausalLM),
    }
    config_cls, model_cls = families[kind]
    kw: dict[str, Any] = {
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 512,
        # Larger than the default 0.02: logits far apart, so greedy never hinges on a near tie.
        "initializer_range": 0.2,
        "tie_word_embeddings": kind != "llama",
    }
    if kind == "gemma3":
        kw |= GEMMA3_TINY
    if kind == "gemma2":
        kw |= GEMMA2_TINY
    if kind == "mixtral":  # four experts, two per token
        kw |= {"num_local_experts": 4, "num_experts_per_tok": 2}
    if kind == "phi3":  # its defaults name Phi-3's 32k vocabulary's special tokens
        kw |= {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    kw.update(overrides)
    torch.manual_seed(seed)
    cfg = config_cls(**kw)
    model = model_cls(cfg).eval()
    if kind.startswith("gemma"):  # HF starts Gemma's (1 + w) norms at w = 0: random w, so the offset is tested
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.normal_(0.0, 0.3)
    return model


# Gemma 3, tiny: three layers, sliding (window 8, shorter than the tests' sequences), global, sliding; the local
# RoPE base differs from the global one and the softmax scale from 1 / sqrt(head_dim).
GEMMA3_TINY: dict[str, Any] = {
    "num_hidden_layers": 3,
    "sliding_window": 8,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    "query_pre_attn_scalar": 24,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
        "full_attention": {"rope_type": "default", "rope_theta": 10000.0},
    },
    "tie_word_embeddings": True,
}


# Gemma 2, tiny: Gemma 3's layers and window, without q/k norms or a local RoPE base, with both soft-caps low enough
# to bite (the tiny model's scores and logits reach past them).
GEMMA2_TINY: dict[str, Any] = {
    "num_hidden_layers": 3,
    "sliding_window": 8,
    "query_pre_attn_scalar": 24,
    "attn_logit_softcapping": 2.0,
    "final_logit_softcapping": 5.0,
    "tie_word_embeddings": True,
}


def loaded_from_hf(hf: Any, eos: frozenset[int] = frozenset(), tokenizer: Any = None) -> LoadedModel:
    return LoadedModel(
        name="tiny",
        path=Path("."),
        model=Decoder.from_hf(hf, hf.config.max_position_embeddings),
        tokenizer=tokenizer or CharTokenizer(),
        hf_config=hf.config,
        eos_token_ids=eos,
        device=torch.device("cpu"),
        dtype=torch.float32,
    )


def kv_bytes_for(hf: Any, tokens: int, dtype: torch.dtype = torch.float32) -> int:
    """KV budget (bytes) holding exactly `tokens` token slots of this model in an arena of `dtype`."""
    c = hf.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return tokens * kv_bytes_per_token(c.num_hidden_layers, c.num_key_value_heads, head_dim, dtype)


def make_engine(
    hf: Any,
    *,
    kv_tokens: int = 4096,
    max_batched_tokens: int = 512,
    max_running_requests: int = 64,
    max_model_len: int | None = None,
    speculation: SpeculationConfig | None = None,
    eos: frozenset[int] = frozenset(),
    proposer: Any = None,
    controller: Any = None,
    weights: str = "fp32",
    prepack_weights: bool | None = None,  # None: where the CPU runs oneDNN's bf16 GEMM (the quantized formats' copy)
    lora: LoRAConfig | None = None,
    kernel_dispatch: str = "fixed",  # tests: the same kernels on every machine, no timing at start
    fused_step: bool = True,
    quant_kernel: str = "auto",
    kv_cache_dtype: str = "auto",
    prefix_caching: bool = True,
    progress: Any = None,  # the lines the engine says at start
) -> LLMEngine:
    kv_dtype = engine_setup.kv_cache_dtype(kv_cache_dtype, torch.float32, weights)
    cfg = embedded_engine_config(
        model="tiny",
        kv_cache_bytes=kv_bytes_for(hf, kv_tokens, kv_dtype),  # exactly kv_tokens slots, whatever their dtype
        kv_cache_dtype=kv_cache_dtype,
        max_batched_tokens=max_batched_tokens,
        max_running_requests=max_running_requests,
        max_model_len=max_model_len,
        speculation=speculation or SpeculationConfig(enabled=False),
        weights=weights,
        prepack_weights=_BF16_GEMM_ERROR is None if prepack_weights is None else prepack_weights,
        kernel_dispatch=kernel_dispatch,
        fused_step=fused_step,
        quant_kernel=quant_kernel,
        prefix_caching=prefix_caching,
        **({} if lora is None else {"lora": lora}),
    )
    return LLMEngine(loaded_from_hf(hf, eos), cfg, proposer=proposer, controller=controller, progress=progress)


class TruthProposer:
    """Drafts plain decoding's own continuation, corrupted at every third step, so drafts are accepted (their
    penalties then count inside the step) and rejected (the correction comes from a processed row)."""

    def __init__(self, truth: dict[str, list[int]], prompt_len: dict[str, int]) -> None:
        self.truth, self.prompt_len, self.calls = truth, prompt_len, 0

    def propose(self, inputs: list[ProposalInput], num_tokens: list[int]) -> list[DraftProposal]:
        out = []
        for inp, k in zip(inputs, num_tokens):
            self.calls += 1
            pos = len(inp.token_ids) - self.prompt_len[inp.seq_id]
            drafts = list(self.truth[inp.seq_id][pos : pos + k])
            if self.calls % 3 == 0 and len(drafts) > 2:
                drafts[2] = (drafts[2] + 1) % VOCAB
            out.append(DraftProposal(drafts, None))
        return out

    def rollback(self, seq_id: str, num_tokens: int) -> None:
        pass

    def release(self, seq_id: str) -> None:
        pass


def random_prompts(lengths: list[int], seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]


def greedy_request(rid: str, prompt: list[int], max_tokens: int, **kw: Any) -> EngineRequest:
    return EngineRequest(rid, prompt, SamplingOptions(max_tokens=max_tokens, ignore_eos=True), **kw)


@torch.inference_mode()
def hf_greedy(hf: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
    out = hf.generate(
        torch.tensor([prompt]),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
    )
    return out[0, len(prompt) :].tolist()


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request: pytest.FixtureRequest) -> Iterator[int]:
    """torch's thread count for the test: 1, then 2 (results that must not depend on it)."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def single_thread() -> Iterator[None]:
    """One torch thread for the module (use with pytestmark = pytest.mark.usefixtures("single_thread"))."""
    with torch_threads(1):
        yield


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """n torch threads inside the block, the caller's count again after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


_BF16_GEMM_ERROR = formats.onednn_bf16_error()
# oneDNN's bf16 GEMM (the bf16 format, and the wide copy of int4/int8) refuses CPUs without AVX-512 BW/VL/DQ or
# AVX-NE-CONVERT outright. The engine never asks for it there (bf16 falls back to fp32 and int4/int8 keep no wide
# copy, tested in test_quant_engine), so tests of its arithmetic cannot run on such a CPU.
needs_bf16_gemm = pytest.mark.skipif(
    _BF16_GEMM_ERROR is not None, reason=f"this CPU cannot run oneDNN's bf16 GEMM: {_BF16_GEMM_ERROR}")


@pytest.fixture(scope="module")
def every_format_runs() -> Iterator[None]:
    """The CPU reads as one that runs every weight format (AVX-512 with BF16).

    On a CPU without AVX512_BF16 or AMX-BF16 (and without AVX2 for our int4/int8
    kernel) the engine loads fp32 instead: a speed decision (torch runs those
    kernels there too, as slower scalar loops), tested on its own in test_quant_engine. Tests of a
    format's own arithmetic and tokens use this so that they check the format
    on every CPU, not fp32 under its name; those that need oneDNN's bf16 GEMM
    are also marked ``needs_bf16_gemm``, the one thing a CPU cannot be made to run.
    """
    with pytest.MonkeyPatch.context() as patch:
        real = formats.CpuFeatures.detect()  # our kernel and oneDNN's bf16 GEMM run where they run
        patch.setattr(formats.CpuFeatures, "detect", classmethod(lambda cls: cls("AVX512", True, real.qgemm,
                                                                               real.bf16_gemm)))
        yield


def scheduler_step(sch: Scheduler, *, finish_at_max_tokens: bool = False) -> SchedulerOutput:
    """One step as the engine runs it, without a model: every sequence that samples gets token 7 (and, when asked,
    those at max_tokens finish)."""
    out = sch.schedule()
    sch.update_from_step(out, {})
    for s in out.scheduled:
        if s.needs_logits:
            s.seq.output_ids.append(7)
            if finish_at_max_tokens and len(s.seq.output_ids) == s.seq.params.max_tokens:
                sch.finish(s.seq, "length")
    return out
