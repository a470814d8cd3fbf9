"""Model resolution and loading: local HF folders, errors, device/dtype; the real default model (marked)."""
from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from _engine_factories import hf_greedy, tiny_hf_model

from engine.config import SpeculationConfig, embedded_engine_config
from engine.llm_engine import LLMEngine
from engine import loader
from engine.loader import load_model, resolve_device, resolve_dtype, resolve_model_dir
from engine.model import UnsupportedModelError
from engine.model_ref import cache_root, converted_dir
from engine.request import EngineRequest, SamplingOptions

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    """A tiny qwen2 saved as an ordinary HF folder with a word-level tokenizer over its 300 ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("tiny-qwen2")
    # 301 rows: AutoTokenizer reads this folder as a Qwen2Tokenizer, which adds <|endoftext|> as id 300.
    hf = tiny_hf_model("qwen2", vocab_size=301)
    hf.save_pretrained(path)
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(300)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=words, eos_token="t1").save_pretrained(path)
    return path, hf


def test_a_local_hf_folder_loads(tiny_folder: tuple[Path, object]) -> None:
    path, hf = tiny_folder
    lines: list[str] = []
    loaded = load_model(str(path), device="cpu", progress=lines.append)
    assert loaded.path == path.resolve() and loaded.dtype == torch.float32
    assert loaded.model.cfg.model_type == "qwen2" and 1 in loaded.eos_token_ids
    assert any("loading model" in line for line in lines)
    prompt = [5, 6, 7, 8]
    engine = LLMEngine(loaded, embedded_engine_config(model=str(path), kv_cache_bytes=1 << 22,
                                                      speculation=SpeculationConfig(enabled=False)))
    out = engine.generate([EngineRequest("x", prompt, SamplingOptions(max_tokens=6, ignore_eos=True))])["x"]
    assert out.token_ids == hf_greedy(hf, prompt, 6)
    assert out.text == loaded.tokenizer.decode(out.token_ids) and out.text.startswith(f"t{out.token_ids[0]}")


@pytest.mark.parametrize("layout", ["sharded safetensors", "pytorch_model.bin"])
def test_sharded_and_bin_checkpoints_load_the_same_model_as_one_safetensors_file(
    tiny_folder: tuple[Path, object], tmp_path: Path, layout: str
) -> None:
    """Shards are read through their index; a folder without safetensors goes through transformers."""
    path, hf = tiny_folder
    for name in os.listdir(path):
        if not name.startswith("model"):
            shutil.copy(path / name, tmp_path / name)
    if layout == "sharded safetensors":
        hf.save_pretrained(tmp_path, max_shard_size="20KB")
        assert (tmp_path / "model.safetensors.index.json").is_file()
    else:
        torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")  # transformers 5 saves safetensors only
    one_file, other = load_model(str(path), device="cpu").model, load_model(str(tmp_path), device="cpu").model
    ours, theirs = one_file.state_dict(), other.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_a_bf16_checkpoint_loads_as_transformers_casts_it_read_tensor_by_tensor(
    tiny_folder: tuple[Path, object], tmp_path: Path
) -> None:
    """The folder's bf16 tensors are read one at a time and cast to fp32: the same weights as transformers'
    from_pretrained(dtype=float32) of that folder."""
    from transformers import AutoModelForCausalLM

    from engine.model import Decoder

    path, hf = tiny_folder
    for name in os.listdir(path):
        if not name.startswith("model"):
            shutil.copy(path / name, tmp_path / name)
    copy.deepcopy(hf).to(torch.bfloat16).save_pretrained(tmp_path)
    ours = load_model(str(tmp_path), device="cpu", dtype="float32").model.state_dict()
    reference = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    theirs = Decoder.from_hf(reference, 64).state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert all(t.dtype == torch.float32 for t in ours.values() if t.is_floating_point())

def test_draft_model_speculation_with_the_target_as_its_own_draft(tiny_folder: tuple[Path, object]) -> None:
    path, hf = tiny_folder
    spec = SpeculationConfig(enabled=True, method="draft", draft_model=str(path), max_draft_tokens=3)
    cfg = embedded_engine_config(model=str(path), device="cpu", kv_cache_bytes=1 << 22, speculation=spec)
    engine = LLMEngine.from_config(cfg)
    # A non-adaptive controller so every step drafts (the adaptive one may decide drafting does not pay).
    from engine.speculative.controller import SpeculationController

    engine.controller = SpeculationController(SpeculationConfig(max_draft_tokens=3, adaptive=False))
    prompts = {"a": [5, 6, 7, 8], "b": [9, 10, 11]}
    res = engine.generate([EngineRequest(r, p, SamplingOptions(max_tokens=10, ignore_eos=True)) for r, p in prompts.items()])
    for rid, prompt in prompts.items():
        assert res[rid].token_ids == hf_greedy(hf, prompt, 10)
        assert res[rid].spec.drafted > 0 and res[rid].spec.accepted == res[rid].spec.drafted  # same model: all accepted
    assert engine.cache_usage().used_tokens == 0


def test_unknown_models_and_architectures_fail_clearly(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="neither a known model .*smollm2-135m-instruct"):
        resolve_model_dir("no-such-model")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel"):
        load_model(str(tmp_path), device="cpu")


def _falcon_gguf(path: Path) -> Path:
    """A real GGUF's metadata, of an architecture we do not run."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "falcon")
    for add, value in [(writer.add_context_length, 128), (writer.add_embedding_length, 32),
                       (writer.add_block_count, 1), (writer.add_feed_forward_length, 64), (writer.add_head_count, 2),
                       (writer.add_head_count_kv, 2), (writer.add_layer_norm_rms_eps, 1e-5),
                       (writer.add_rope_dimension_count, 16)]:
        add(value)
    writer.add_tensor("token_embd.weight", np.zeros((8, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_gguf_of_an_unsupported_architecture_is_refused_before_it_is_converted(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SPECSTREAM_CACHE_DIR", str(tmp_path / "cache"))
    path = _falcon_gguf(tmp_path / "falcon.gguf")
    with pytest.raises(UnsupportedModelError, match="'falcon'.*supported: llama.*gemma3_text"):
        resolve_model_dir(str(path))
    assert not (tmp_path / "cache" / "models").exists() or not any((tmp_path / "cache" / "models").iterdir())


def test_while_converting_one_parse_of_the_gguf_serves_every_reader(tmp_path: Path) -> None:
    import gguf

    path = _falcon_gguf(tmp_path / "falcon.gguf")
    with loader.gguf_parsed_once():
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is first and "general.architecture" in first.fields
    assert gguf.GGUFReader(path) is not first  # only while converting: a file may change between starts


def test_a_second_start_converting_the_same_gguf_waits_for_the_first_ones_folder(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import threading

    from transformers import AutoConfig

    monkeypatch.setenv("SPECSTREAM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(AutoConfig, "from_pretrained", lambda *a, **k: None)  # the architecture check passes
    monkeypatch.setattr(loader.DecoderConfig, "from_hf", lambda config: None)
    conversions: list[Path] = []

    def convert(gguf: Path, name: str, final: Path, progress: object) -> None:
        conversions.append(final)
        threading.Event().wait(0.3)  # long enough for the other start to arrive while this one converts
        final.mkdir()
        (final / "config.json").write_text("{}")

    monkeypatch.setattr(loader, "_convert", convert)
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" + bytes(1000))
    folders: list[Path] = []
    starts = [threading.Thread(target=lambda: folders.append(loader.convert_gguf(path, "m"))) for _ in range(2)]
    for start in starts:
        start.start()
    for start in starts:
        start.join()
    assert len(conversions) == 1 and folders == [conversions[0]] * 2


def test_specstream_cache_dir_overrides_where_models_are_cached(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SPECSTREAM_CACHE_DIR", str(tmp_path))
    assert cache_root() == tmp_path / "models"
    monkeypatch.delenv("SPECSTREAM_CACHE_DIR")
    assert cache_root() == Path.home() / ".cache" / "specstream" / "models"


def test_a_reinstalled_gguf_finds_its_conversion_and_a_changed_one_does_not(tmp_path: Path) -> None:
    # A fresh clone reinstalls the package: same bytes, new path, new mtime.
    first = tmp_path / "a" / "model.gguf"
    first.parent.mkdir()
    first.write_bytes(bytes(range(256)) * 64_000)
    copy = tmp_path / "b" / "model.gguf"
    copy.parent.mkdir()
    copy.write_bytes(first.read_bytes())
    os.utime(copy, ns=(1, 1))
    assert converted_dir(copy, "m") == converted_dir(first, "m")

    changed = bytearray(first.read_bytes())
    changed[100] ^= 0xFF  # inside the header and tensor index
    copy.write_bytes(bytes(changed))
    assert converted_dir(copy, "m") != converted_dir(first, "m")


def test_auto_picks_float32_on_cpu_and_bfloat16_on_cuda_and_unknown_dtypes_are_refused() -> None:
    cpu = torch.device("cpu")
    assert resolve_dtype("auto", cpu) == torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("float16", cpu) == torch.float16
    with pytest.raises(ValueError):
        resolve_dtype("int3", cpu)
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
