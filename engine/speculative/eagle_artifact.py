"""A trained draft head on disk: `head.safetensors` + `config.json`, one folder per version.

    ~/.cache/specstream/draft-heads/<name>/<version>/{head.safetensors,config.json}

`engine.speculation.draft_head` names a version folder, or a head folder (its
newest version is used), or a bare name under the default root. Everything is
checked when the worker starts: a missing or truncated file, a config of
another format, tensors of the wrong shape, or a head trained for another
target fail at load with the path in the message, never at a first request.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.meta_init import skeleton
from engine.model import Decoder
from engine.speculative.eagle_head import EagleHead, target_fingerprint

FORMAT = "specstream.eagle-head/1"
WEIGHTS_FILE = "head.safetensors"
CONFIG_FILE = "config.json"


class DraftHeadError(ValueError):
    """The draft head cannot be used (a startup error; the message names the file)."""


class DraftHeadMismatch(DraftHeadError):
    """The head was trained for another target model."""


def default_root() -> Path:
    return Path(os.environ.get("SPECSTREAM_DRAFT_HEADS", Path.home() / ".cache" / "specstream" / "draft-heads"))


@dataclass
class HeadMeta:
    """config.json: what the head was trained for, on what, and how well it drafted on held-out data."""

    target_model: str
    target_fingerprint: str
    hidden_size: int
    draft_vocab_size: int
    version: str
    format: str = FORMAT
    train: dict[str, Any] = field(default_factory=dict)  # samples, tokens, epochs, seconds, ...
    # acceptance_by_position[i]: P(draft i + 1 accepted | drafts 1..i accepted), greedy, held-out slice.
    acceptance_by_position: list[float] = field(default_factory=list)


def save_head(folder: Path, head: EagleHead, meta: HeadMeta) -> Path:
    """Write one version folder (created; an existing one is replaced). Returns it."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in head.state_dict().items()}
    tensors["draft_vocab"] = head.draft_vocab.detach().to("cpu", torch.long).contiguous()
    save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": FORMAT, "target": meta.target_fingerprint})
    (folder / CONFIG_FILE).write_text(json.dumps(asdict(meta), indent=1) + "\n")
    return folder


def resolve_head_dir(ref: str) -> Path:
    """The version folder `ref` names (see the module docstring)."""
    path = Path(ref).expanduser()
    if not path.exists() and os.sep not in ref:
        path = default_root() / ref
    if (path / CONFIG_FILE).is_file():
        return path
    if path.is_dir():
        versions = sorted(p for p in path.iterdir() if (p / CONFIG_FILE).is_file())
        if versions:
            return versions[-1]
    raise DraftHeadError(f"draft head {ref}: no {CONFIG_FILE} in {path} nor in a version folder under it")


def read_meta(folder: Path) -> HeadMeta:
    path = folder / CONFIG_FILE
    try:
        raw = json.loads(path.read_text())
        meta = HeadMeta(**raw)
    except (OSError, ValueError, TypeError) as error:
        raise DraftHeadError(f"draft head config {path} is unreadable: {error}") from None
    if meta.format != FORMAT:
        raise DraftHeadError(f"draft head config {path} has format {meta.format!r}, this engine reads {FORMAT!r}")
    return meta


def load_head(ref: str, target: Decoder, target_name: str) -> tuple[EagleHead, HeadMeta]:
    """Load, check against `target` (unquantized weights) and bind a head; DraftHeadError if unusable."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = resolve_head_dir(ref)
    meta = read_meta(folder)
    ours = target_fingerprint(target)
    if meta.target_fingerprint != ours:
        raise DraftHeadMismatch(
            f"draft head {folder} was trained for {meta.target_model} (fingerprint {meta.target_fingerprint}); "
            f"this worker serves {target_name} (fingerprint {ours}): train one for it with "
            "`specstream draft train`"
        )
    weights = folder / WEIGHTS_FILE
    try:
        tensors = load_file(str(weights))
    except (OSError, SafetensorError) as error:
        raise DraftHeadError(f"draft head weights {weights} are unreadable (truncated?): {error}") from None
    vocab = tensors.get("draft_vocab")
    if vocab is None or vocab.dim() != 1 or vocab.shape[0] != meta.draft_vocab_size:
        raise DraftHeadError(f"draft head weights {weights}: draft_vocab missing or not [{meta.draft_vocab_size}]")
    if int(vocab.max()) >= target.cfg.vocab_size or int(vocab.min()) < 0:
        raise DraftHeadError(f"draft head weights {weights}: draft_vocab holds ids outside the target's vocabulary")
    with skeleton():
        head = EagleHead(target.cfg, torch.zeros(meta.draft_vocab_size, dtype=torch.long))
    try:
        head.load_state_dict(tensors, strict=True, assign=True)
    except RuntimeError as error:
        first = str(error).strip().splitlines()
        raise DraftHeadError(f"draft head weights {weights} do not fit the target: {' '.join(first[:3])}") from None
    head = head.to(device=target.device, dtype=target.dtype)
    head.draft_vocab = head.draft_vocab.to(target.device, torch.long)
    head.eval().requires_grad_(False)
    head.bind(target)
    return head, meta
