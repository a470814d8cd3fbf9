"""Weight formats on the real default model (its Q4_1 GGUF): the int4 codes are the file's own
(they dequantize to exactly the weights transformers converts the file to), int4 stays within
1.3x of the file in memory, and speculation keeps each format's own tokens on the benchmark
prompts, greedy and seeded."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from bench.workloads import CODE_EDIT, OPEN_QUESTION, RAG_ANSWER, Workload
from engine.config import SpeculationConfig, embedded_engine_config
from engine.llm_engine import LLMEngine
from engine.loader import load_model
from engine.model_ref import KNOWN_MODELS
from engine.quant.apply import weight_bytes
from engine.quant.gguf_repack import read_gguf_weights
from engine.request import EngineRequest, SamplingOptions
from engine.step_record import StepRecord
from tests.unit.engine._engine_factories import (  # noqa: F401  (fixtures)
    every_format_runs,
    needs_bf16_gemm,
    single_thread,
    torch_threads,
)

pytestmark = [pytest.mark.model, pytest.mark.usefixtures("single_thread", "every_format_runs")]

MODEL = "smollm2-135m-instruct"
PARAMS = [
    SamplingOptions(max_tokens=24, temperature=0.0, ignore_eos=True),
    SamplingOptions(max_tokens=24, temperature=0.8, top_p=0.95, seed=11, ignore_eos=True),
]


def _engine(fmt: str, speculate: bool, wide: bool = True) -> LLMEngine:
    spec = SpeculationConfig(enabled=speculate, method="ngram", adaptive=False)
    cfg = embedded_engine_config(model=MODEL, weights=fmt, prepack_weights=wide, kv_cache_bytes=64 << 20, speculation=spec)
    return LLMEngine.from_config(cfg)


def test_int4_codes_and_the_q8_0_embedding_are_the_gguf_files_own_weights() -> None:
    fp32 = load_model(MODEL, device="cpu").model  # transformers' dequantization of the file
    int4 = read_gguf_weights(KNOWN_MODELS[MODEL].locate(), fp32.cfg, "int4", "int8")
    for name, module in fp32.layers.named_modules(prefix="layers"):
        if isinstance(module, torch.nn.Linear):
            assert torch.equal(int4[name].dequantize(), module.weight), name
    # The tied embedding and head: the file's Q8_0 blocks, not quantized again per row.
    assert int4["embed_tokens"].blocked and torch.equal(int4["embed_tokens"].dequantize(), fp32.embed_tokens.weight)


def test_the_default_format_serves_the_shipped_q4_1_file_as_int4_saying_why() -> None:
    said: list[str] = []
    cfg = embedded_engine_config(model=MODEL, kv_cache_bytes=16 << 20)
    assert cfg.weights == "auto"  # the default
    engine = LLMEngine.from_config(cfg, progress=said.append)
    assert engine.weight_format == "int4"  # every_format_runs: the CPU reads as one that runs it
    assert ("engine.weights auto: int4, the fastest format that keeps SmolLM2-135M-Instruct.Q4_1.gguf's Q4_1 "
            "linears and Q8_0 embedding exactly") in said


def test_int4_weights_stay_within_1_3x_of_the_gguf_file() -> None:
    file_bytes = KNOWN_MODELS[MODEL].locate().stat().st_size
    lean = _engine("int4", speculate=False, wide=False)
    assert lean.weight_format == "int4"
    assert weight_bytes(lean.model) <= 1.3 * file_bytes
    # The bf16 copy for wide steps (where oneDNN's bf16 GEMM runs): 2 bytes per linear weight on top.
    assert weight_bytes(_engine("int4", speculate=False).model) <= 1.3 * file_bytes + 2 * 135e6


@dataclass
class EnginePair:
    """The plain and the speculating engine of one format, built once for that format's greedy and seeded runs.

    Sharing them proves the same as building them anew: generate() runs its requests to completion and frees
    their cache, seeded noise is a function of (seed, position) alone, and the n-gram proposer and non-adaptive
    speculation keep nothing between requests (each engine already serves both workloads in turn). Only the
    current format's pair is kept, so at most two models are in memory."""

    fmt: str = ""
    engines: tuple[LLMEngine, LLMEngine] | None = None

    def of(self, fmt: str) -> tuple[LLMEngine, LLMEngine]:
        if self.fmt != fmt or self.engines is None:
            self.engines = None  # the previous format's weights go before the next ones load
            self.fmt, self.engines = fmt, (_engine(fmt, speculate=False), _engine(fmt, speculate=True))
        return self.engines


def _ids(engine: LLMEngine, workload: Workload) -> list[int]:
    enc = engine.tokenizer.apply_chat_template(workload.messages, add_generation_prompt=True, tokenize=True)
    return list(enc["input_ids"] if hasattr(enc, "keys") else enc)


@pytest.fixture(scope="module")
def engine_pair() -> EnginePair:
    return EnginePair()


# Seeded sampling at temperature 0.8 flips on any rounding difference: these hold only because
# verification rows attend like decodes (Attention._rows_as_decodes; without it int8 and bf16
# drift on the code edit: hidden states 9e-2 apart at the first generated position, fp32 3e-5)
# and because the bf16 GEMM gives a row the same output at 1 row as at 1 + k (Bf16Kernel; a
# plain 1-row call rounds the down projection differently and bf16-seeded drifted at token 5).
# Each format's greedy and seeded cases run one after the other, on one EnginePair.
@pytest.mark.parametrize(
    ("fmt", "params"),
    [
        pytest.param(f, p, id=f"{f}-{kind}", marks=[needs_bf16_gemm] if f == "bf16" else [])
        for f in ("fp32", "int4", "int8", "bf16")
        for kind, p in (("greedy", PARAMS[0]), ("seeded", PARAMS[1]))
    ],
)
def test_speculation_keeps_each_formats_own_tokens_on_the_benchmark_prompts(
        fmt: str, params: SamplingOptions, engine_pair: EnginePair) -> None:
    plain, spec = engine_pair.of(fmt)
    drafted = 0
    for workload in (CODE_EDIT, RAG_ANSWER):
        ids = _ids(plain, workload)
        want = plain.generate([EngineRequest("r", ids, params)])["r"]
        got = spec.generate([EngineRequest("r", ids, params)])["r"]
        assert got.token_ids == want.token_ids, (fmt, workload.name)
        drafted += got.spec.drafted
    assert drafted > 0


@needs_bf16_gemm
def test_a_bf16_requests_seeded_tokens_do_not_depend_on_prefills_sharing_its_steps(engine_pair: EnginePair) -> None:
    # The scheduler fills a step's token budget with other requests' prefill chunks, so a decode row
    # runs in a call of hundreds of rows; oneDNN rounds such calls differently from a 1-row one on
    # CPUs whose invariant window is 32 rows (Bf16Kernel runs wide steps in pieces inside it).
    # Without the pieces the seeded answer below drifted at token 15 on such a CPU.
    plain, _ = engine_pair.of("bf16")
    prompt, other = (_ids(plain, w) for w in (OPEN_QUESTION, RAG_ANSWER))  # 45 and 635 tokens
    alone = plain.generate([EngineRequest("a", prompt, PARAMS[1])])["a"].token_ids
    plain.add_request(EngineRequest("a", prompt, PARAMS[1]))
    shared: list[int] = []
    for step in range(1, 100):
        if not plain.has_unfinished():
            break
        shared += [t for out in plain.step() if out.request_id == "a" for t in out.token_ids]
        if step in (2, 5, 9, 13):  # a long prompt arrives while "a" decodes
            plain.add_request(EngineRequest(f"b{step}", other, SamplingOptions(max_tokens=2, temperature=0.0)))
    assert shared == alone


def test_requests_prefilled_and_decoded_together_on_two_threads_keep_their_solo_tokens(engine_pair: EnginePair) -> None:
    # Together, the three prompts are cut into other chunks than alone (the step's budget is shared), and their
    # decodes go to the row kernel in one parallel region, cut into runs of about equal work across the sequences:
    # a 635-token RAG answer beside a 45-token question. Each row's bits follow what it is (a prompt's row on the
    # chunk kernel, a decode's on the row kernel) and the int4 kernel's exact sums, not its step: each request must
    # get the tokens it gets alone.
    plain, _ = engine_pair.of("int4")
    seeded = PARAMS[1]  # flips on any rounding difference (greedy tokens held before prompts had their kernel)
    prompts = {w.name: _ids(plain, w) for w in (RAG_ANSWER, CODE_EDIT, OPEN_QUESTION)}
    chunks: dict[str, dict[str, list[int]]] = {"alone": {}, "together": {}}  # request -> its prompt's chunks
    recording: list[str] = []  # the engine is shared with other tests: record only here

    def observe(record: StepRecord) -> None:
        for s in record.batch.scheduled:
            if recording and s.is_prefill:
                chunks[recording[0]].setdefault(s.seq.request_id, []).append(s.num_new_tokens)

    plain.add_step_observer(observe)
    with torch_threads(2):
        recording[:] = ["alone"]
        alone = {name: plain.generate([EngineRequest(name, ids, seeded)])[name].token_ids for name, ids in prompts.items()}
        recording[:] = ["together"]
        together = plain.generate([EngineRequest(name, ids, seeded) for name, ids in prompts.items()])
        recording.clear()
    assert chunks["together"] != chunks["alone"], chunks  # the prompts were cut otherwise
    assert {name: out.token_ids for name, out in together.items()} == alone
