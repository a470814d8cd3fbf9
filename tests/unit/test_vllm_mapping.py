"""Our requests and settings in vLLM's terms (streams.worker.vllm_mapping), checked without vLLM installed.

The stack test (tests/stacks/test_vllm_backend.py) runs the same mapping against vLLM itself."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.request import EngineRequest, RequestRejected, SamplingOptions
from streams.worker.vllm_adapters import check_adapter
from streams.worker.vllm_mapping import engine_kwargs, sampling_kwargs

# SamplingOptions fields and the SamplingParams argument each becomes (same name unless listed).
_RENAMED: dict[str, str] = {}


def test_every_sampling_option_reaches_vllm_under_its_name() -> None:
    options = SamplingOptions(max_tokens=9, temperature=0.7, top_p=0.9, top_k=5, seed=3, stop=("x",), ignore_eos=True,
                              presence_penalty=0.1, frequency_penalty=0.2, repetition_penalty=1.1, min_p=0.05,
                              logit_bias=((7, 2.0),), stop_token_ids=(4,), min_tokens=2, logprobs=3,
                              prompt_logprobs=1)
    kwargs = sampling_kwargs(EngineRequest("r", [1, 2], options), speculates=False)
    for option in dataclasses.fields(SamplingOptions):
        value = getattr(options, option.name)
        expected = dict(value) if option.name == "logit_bias" else list(value) if isinstance(value, tuple) else value
        assert kwargs[_RENAMED.get(option.name, option.name)] == expected, option.name
    assert kwargs["n"] == 1 and kwargs["include_stop_str_in_output"] is False


def test_defaults_mean_the_same_no_filter_in_both() -> None:
    kwargs = sampling_kwargs(EngineRequest("r", [1]), speculates=True)
    assert kwargs["top_k"] == 0 and kwargs["top_p"] == 1.0 and kwargs["seed"] is None and "logit_bias" not in kwargs


def test_speculation_off_per_request_is_refused_by_name_when_the_engine_speculates() -> None:
    with pytest.raises(RequestRejected) as refused:
        sampling_kwargs(EngineRequest("r", [1], speculation=False), speculates=True)
    assert refused.value.code == "invalid_request" and "speculation: false" in refused.value.message


def test_a_constraint_reaches_vllms_guidance_backend_as_the_same_llguidance_grammar() -> None:
    from engine.grammar.constraint import ToolFunction, json_constraint, tool_calls_constraint

    for constraint in (json_constraint({"type": "object", "properties": {"a": {"type": "integer"}}}),
                       tool_calls_constraint([ToolFunction("f", {"type": "object"})], "required", parallel=False)):
        kwargs = sampling_kwargs(EngineRequest("r", [1], constraint=constraint), speculates=True)
        assert kwargs["structured_outputs"] == {"grammar": constraint.grammar}
    assert "structured_outputs" not in sampling_kwargs(EngineRequest("r", [1]), speculates=True)
    assert engine_kwargs(EngineConfig(backend="vllm"), "/m", 2048)["structured_outputs_config"] == {
        "backend": "guidance"}


def test_speculation_off_per_request_is_accepted_when_the_engine_does_not_speculate() -> None:
    assert sampling_kwargs(EngineRequest("r", [1], speculation=False), speculates=False)["n"] == 1


def test_engine_settings_map_onto_engine_args() -> None:
    config = EngineConfig(backend="vllm", max_model_len=1024, kv_cache_bytes="512MiB", max_running_requests=16,
                          prefix_caching=False, speculation={"method": "ngram", "max_draft_tokens": 5})
    kwargs = engine_kwargs(config, "/m", max_model_len_default=2048)
    assert kwargs["model"] == "/m" and kwargs["max_model_len"] == 1024 and kwargs["max_num_seqs"] == 16
    assert kwargs["kv_cache_memory_bytes"] == 512 << 20 and "gpu_memory_utilization" not in kwargs
    assert kwargs["enable_prefix_caching"] is False and kwargs["scheduling_policy"] == "priority"
    assert kwargs["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 5,
                                            "prompt_lookup_min": 1, "prompt_lookup_max": 4}
    assert kwargs["dtype"] == "bfloat16"


def test_suffix_decoding_maps_onto_vllms_suffix_method_with_the_same_knobs() -> None:
    config = EngineConfig(speculation={"method": "suffix", "max_draft_tokens": 6, "suffix_max_depth": 32,
                                       "suffix_min_token_prob": 0.2, "suffix_max_outputs": 500})
    assert engine_kwargs(config, "/m", max_model_len_default=2048)["speculative_config"] == {
        "method": "suffix", "num_speculative_tokens": 6, "suffix_decoding_max_tree_depth": 32,
        "suffix_decoding_max_spec_factor": 1.0, "suffix_decoding_min_token_prob": 0.2,
        "suffix_decoding_max_cached_requests": 500}


def test_the_default_context_is_our_engines_and_speculation_off_sends_no_speculative_config() -> None:
    kwargs = engine_kwargs(EngineConfig(speculation={"enabled": False}), "/m", max_model_len_default=2048)
    assert kwargs["max_model_len"] == 2048 and "speculative_config" not in kwargs


@pytest.mark.parametrize(("settings", "named"), [
    ({"speculation": {"method": "eagle", "draft_head": "/heads/h"}}, "engine.speculation.method"),
])
def test_settings_vllm_cannot_run_fail_at_start_naming_the_key(settings: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        engine_kwargs(EngineConfig(**settings), "/m", max_model_len_default=2048)


def test_lora_slots_map_onto_vllms_and_off_means_no_lora() -> None:
    kwargs = engine_kwargs(EngineConfig(lora={"max_loaded": 3, "max_rank": 24}), "/m", 2048)
    # vLLM takes only some ranks: the smallest that holds ours (ours is checked when an adapter is read).
    assert (kwargs["enable_lora"], kwargs["max_loras"], kwargs["max_lora_rank"]) == (True, 3, 32)
    assert "enable_lora" not in engine_kwargs(EngineConfig(lora={"max_loaded": 0}), "/m", 2048)


def test_an_adapter_folder_vllm_cannot_serve_is_refused_at_read_naming_why(tmp_path: Path) -> None:
    folder = tmp_path / "a"
    folder.mkdir()
    with pytest.raises(ValueError, match="adapter_config.json and adapter_model.safetensors"):
        check_adapter("a", str(folder), 16)
    (folder / "adapter_model.safetensors").write_bytes(b"x" * 10)
    for config, why in (({"peft_type": "LORA", "r": 32}, "rank 32 is outside 1..engine.lora.max_rank"),
                        ({"peft_type": "LORA", "r": 8, "use_dora": True}, "DoRA"),
                        ({"peft_type": "IA3"}, "is not LoRA")):
        (folder / "adapter_config.json").write_text(json.dumps(config))
        with pytest.raises(ValueError, match=why):
            check_adapter("a", str(folder), 16)
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    assert check_adapter("a", str(folder), 16).nbytes() == 10


def test_with_lora_and_speculation_the_step_budget_holds_every_running_requests_drafts_as_vllm_requires() -> None:
    both = EngineConfig(max_running_requests=64, max_batched_tokens=512, lora={"max_loaded": 2},
                        speculation={"method": "ngram", "max_draft_tokens": 8})
    assert engine_kwargs(both, "/m", 2048)["max_num_batched_tokens"] == 64 * 9
    no_lora = both.model_copy(update={"lora": both.lora.model_copy(update={"max_loaded": 0})})
    assert engine_kwargs(no_lora, "/m", 2048)["max_num_batched_tokens"] == 512
