"""Training an EAGLE head on CPU from token sequences the target produced.

1. `collect_features`: ONE target pass over every sequence (flat batches, like
   serving) keeps each position's final-normed hidden state f_j and the
   target's greedy next token (argmax of its logits), the label a draft must hit.
2. `draft_vocabulary`: the most frequent labels (eagle_head.py says why).
3. `train_head`: teacher forcing as in EAGLE-1: position j reads
   concat(f_j + noise, e(x_{j+1})) and is trained to output f_{j+1}
   (smooth L1) whose LM-head argmax is the target's label at j + 1 (cross
   entropy over the draft vocabulary). The uniform noise on the input features
   stands in for the head's own imperfect guesses it reads from the second
   draft position on; with `rollout` > 1 the head is also trained on those
   guesses themselves (EAGLE-3's training-time test, EagleHead.forward_rollout):
   draft depths 2..rollout read the head's own outputs and attend as serving's
   later drafts do (the first draft's loss weighs as much as the rest together).
"""
from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.kv_cache import KVCache
from engine.model import Decoder
from engine.runner import FlatBatchBuilder
from engine.speculative.eagle_head import EagleHead, init_from_target

Progress = Callable[[str], None]


@dataclass
class TrainExample:
    tokens: torch.Tensor  # [L] int64: prompt + completion
    features: torch.Tensor  # [L, hidden] fp32: the target's final-normed hidden state at each position
    labels: torch.Tensor  # [L] int64: the target's greedy next token after each position
    num_prompt_tokens: int


@dataclass
class TrainConfig:
    epochs: int = 10
    lr: float = 1e-3
    # Tokens (padding included) per optimizer step: small, because a CPU run affords few
    # tokens and the head needs many steps (2048 gave 13 steps an epoch on 160 answers: top-1 0.14).
    batch_tokens: int = 512
    draft_vocab_size: int = 8192
    noise: float = 0.2  # half-width of the uniform noise added to input features (EAGLE-1)
    cls_weight: float = 0.1  # weight of the cross entropy next to the feature regression (EAGLE-1)
    rollout: int = 1  # draft depths trained on the head's own outputs (1: teacher forcing only)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rollout < 1:
            raise ValueError(f"rollout must be >= 1, got {self.rollout}")


def bar(done: int, total: int, width: int = 24) -> str:
    filled = width * done // max(total, 1)
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}"


@torch.inference_mode()
def collect_features(
    target: Decoder, sequences: list[tuple[list[int], int]], progress: Progress, batch_tokens: int = 2048
) -> list[TrainExample]:
    """sequences: (tokens, num_prompt_tokens). One flat target forward per ~batch_tokens tokens."""
    cfg, out = target.cfg, []
    order = list(range(len(sequences)))
    done = 0
    while order:
        batch, total = [], 0
        while order and (not batch or total + len(sequences[order[0]][0]) <= batch_tokens):
            batch.append(order.pop(0))
            total += len(sequences[batch[-1]][0])
        cache = KVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, total, target.dtype, target.device)
        builder = FlatBatchBuilder(target.device)
        offsets = _offsets(sequences, batch)
        starts = [builder.add(sequences[i][0], 0, start, prompt=True) for i, start in zip(batch, offsets)]
        hidden = target(*builder.build(cache))  # [T, hidden]
        labels = torch.cat([target.compute_logits(h).argmax(-1) for h in hidden.split(256)])  # [T]
        for i, s in zip(batch, starts):
            toks, n_prompt = sequences[i]
            rows = slice(s, s + len(toks))
            out.append(TrainExample(torch.tensor(toks), hidden[rows].float().clone(), labels[rows].clone(), n_prompt))
        done += len(batch)
        progress(f"target pass {bar(done, len(sequences))}")
    return out


def _offsets(sequences: list[tuple[list[int], int]], batch: list[int]) -> list[int]:
    offsets, at = [], 0
    for i in batch:
        offsets.append(at)
        at += len(sequences[i][0])
    return offsets


def draft_vocabulary(examples: list[TrainExample], size: int) -> torch.Tensor:
    """[<= size] int64: the most frequent target labels, most frequent first."""
    counts = torch.bincount(torch.cat([e.labels for e in examples]))
    seen = int((counts > 0).sum())
    return counts.argsort(descending=True, stable=True)[: min(size, seen)]


def train_head(
    target: Decoder, examples: list[TrainExample], cfg: TrainConfig, progress: Progress
) -> tuple[EagleHead, dict[str, float]]:
    """A head trained on `examples`; returns it (bound, eval mode) and training figures."""
    torch.manual_seed(cfg.seed)
    vocab = draft_vocabulary(examples, cfg.draft_vocab_size)
    head = EagleHead(target.cfg, vocab).float()
    init_from_target(head, target)
    head.bind(target)
    index_of = torch.full((target.cfg.vocab_size,), -100, dtype=torch.long)  # target id -> draft index
    index_of[vocab] = torch.arange(vocab.shape[0])
    batches = _batches(examples, cfg.batch_tokens, cfg.seed)
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=0.0)
    total_steps = cfg.epochs * len(batches)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * s / total_steps)))
    t0, step, figures = time.perf_counter(), 0, {}
    head.train()
    for epoch in range(cfg.epochs):
        random.Random(cfg.seed + epoch).shuffle(batches)
        seen = correct = 0
        for batch in batches:
            loss, hits, n = _loss(head, target, [examples[i] for i in batch], index_of, cfg)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 0.5)
            opt.step()
            sched.step()
            step, seen, correct = step + 1, seen + n, correct + hits
            if step % 10 == 0 or step == total_steps:
                elapsed = time.perf_counter() - t0
                progress(f"epoch {epoch + 1}/{cfg.epochs} {bar(step, total_steps)} loss {loss.item():.3f} "
                         f"top-1 {correct / max(seen, 1):.2f} {elapsed:.0f}s")
        figures = {"train_top1": correct / max(seen, 1), "train_loss": float(loss.item())}
    head.eval().requires_grad_(False)
    figures["train_seconds"] = time.perf_counter() - t0
    return head, figures


def _batches(examples: list[TrainExample], batch_tokens: int, seed: int) -> list[list[int]]:
    """Examples of similar length together (little padding), at most batch_tokens padded tokens each."""
    order = sorted(range(len(examples)), key=lambda i: (len(examples[i].tokens), i))
    out: list[list[int]] = []
    for i in order:
        width = len(examples[i].tokens)
        if out and width * (len(out[-1]) + 1) <= batch_tokens:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def _loss(
    head: EagleHead, target: Decoder, batch: list[TrainExample], index_of: torch.Tensor, cfg: TrainConfig
) -> tuple[torch.Tensor, int, int]:
    """Loss of one padded batch over the draft depths; also (teacher-forced correct top-1, counted positions)."""
    width = max(len(e.tokens) for e in batch) - 1  # position j pairs with x_{j+1}: L - 1 inputs
    hidden = target.cfg.hidden_size
    feats = torch.zeros(len(batch), width, hidden)  # [B, W, H]: f_j
    goal = torch.zeros(len(batch), width, hidden)  # [B, W, H]: f_{j+1}
    nxt = torch.zeros(len(batch), width, dtype=torch.long)  # [B, W]: x_{j+1}
    labels = torch.full((len(batch), width), -100, dtype=torch.long)  # [B, W]: draft index of label_{j+1}
    for b, e in enumerate(batch):
        n = len(e.tokens) - 1
        feats[b, :n], goal[b, :n] = e.features[:-1], e.features[1:]
        nxt[b, :n] = e.tokens[1:]
        labels[b, :n] = index_of[e.labels[1:]]
    mask = torch.zeros(len(batch), width, dtype=torch.bool)  # [B, W]: real positions
    for b, e in enumerate(batch):
        mask[b, : len(e.tokens) - 1] = True
    with torch.no_grad():
        emb = target.embed(nxt).float()  # [B, W, H]
    noisy = feats + (torch.rand_like(feats) * 2 - 1) * cfg.noise
    cos = target.rope_cos[:width].float()  # type: ignore[index]  # [W, D]
    sin = target.rope_sin[:width].float()  # type: ignore[index]
    outs = head.forward_rollout(torch.cat([noisy, emb], dim=-1), emb, cos, sin, cfg.rollout)  # depth x [B, W, H]
    loss = torch.zeros(())
    hits = counted = 0
    for depth, g in enumerate(outs, start=1):
        at = mask.clone()
        at[:, : depth - 1] = False  # depth d needs d - 1 earlier pairs to chain from
        depth_loss, depth_hits, depth_counted = _depth_loss(head, g[at], goal[at], labels[at], cfg)
        loss = loss + depth_loss * _depth_weight(depth, len(outs))
        if depth == 1:  # the reported top-1 stays teacher-forced, comparable across rollout settings
            hits, counted = depth_hits, depth_counted
    return loss, hits, counted


def _depth_weight(depth: int, depths: int) -> float:
    """The first draft gets half the weight, the later depths share the rest: no later draft counts unless
    the first is accepted, and equal weights cost it 0.06 of held-out acceptance (0.47 -> 0.41, 1,000 answers)."""
    if depths == 1:
        return 1.0
    return 0.5 if depth == 1 else 0.5 / (depths - 1)


def _depth_loss(
    head: EagleHead, g: torch.Tensor, goal: torch.Tensor, labels: torch.Tensor, cfg: TrainConfig
) -> tuple[torch.Tensor, int, int]:
    """g, goal [N, H], labels [N] (draft index, -100 outside the draft vocabulary): loss, hits, counted."""
    reg = F.smooth_l1_loss(g, goal)
    logits = head.logits(g)  # [N, Vd]
    valid = labels >= 0
    cls = F.cross_entropy(logits, labels, ignore_index=-100) if bool(valid.any()) else logits.sum() * 0.0
    hits = int((logits.argmax(-1) == labels)[valid].sum())
    return reg + cfg.cls_weight * cls, hits, int(valid.sum())
