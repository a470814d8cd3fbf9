"""PEFT LoRA adapters built inside the tests: random ones on tiny models, briefly trained ones on the default model."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

ALL_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def peft_model(hf: Any, *, r: int = 4, alpha: float = 8.0, targets: list[str] | None = None, seed: int = 0,
               rslora: bool = False, dora: bool = False, random_b: bool = True) -> Any:
    """hf wrapped in a PEFT LoRA model; random_b: B starts random (not zeros), so the adapter changes the output
    without training (PEFT's init_lora_weights=False)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    config = LoraConfig(r=r, lora_alpha=alpha, target_modules=targets or ALL_PROJECTIONS, lora_dropout=0.0,
                        use_rslora=rslora, use_dora=dora, init_lora_weights=not random_b)
    return get_peft_model(hf, config)


def save_random_adapter(hf: Any, folder: Path, std: float = 0.3, **kw: Any) -> Path:
    """A random adapter for hf (A and B ~ N(0, std)) saved as PEFT files in folder; hf itself is left unadapted."""
    import copy

    model = peft_model(copy.deepcopy(hf), **kw)
    with torch.no_grad():  # random A and B large enough to move tiny models' greedy choices
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.normal_(0.0, std)
    model.save_pretrained(folder)
    return folder


def train_adapter(hf: Any, tokenizer: Any, folder: Path, sentence: str, *, steps: int = 12, seed: int = 0,
                  r: int = 8, targets: list[str] | None = None) -> Path:
    """A few seconds of LoRA training on one fixed sentence (so greedy output visibly changes), saved to folder."""
    import copy

    model = peft_model(copy.deepcopy(hf), r=r, alpha=2.0 * r, targets=targets, seed=seed, random_b=False)
    model.train()
    ids = torch.tensor([tokenizer(sentence)["input_ids"]])
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    model.save_pretrained(folder)
    return folder


def edit_config(folder: Path, **changes: Any) -> Path:
    path = folder / "adapter_config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))
    return folder


@torch.inference_mode()
def peft_greedy(folder: Path, hf: Any, prompt: list[int], max_new_tokens: int,
                eos_token_id: list[int] | None = None) -> list[int]:
    """HF + PEFT's greedy continuation of prompt with the adapter in folder (up to an EOS when given)."""
    import copy

    from peft import PeftModel

    model = PeftModel.from_pretrained(copy.deepcopy(hf), str(folder)).eval()
    out = model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=eos_token_id, pad_token_id=0, attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    return out[0, len(prompt):].tolist()
