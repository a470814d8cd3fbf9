"""Sampling with position-keyed randomness.

Why position-keyed: a request that is redelivered after a worker crash must
regenerate exactly the same text. The text must therefore not depend on what
else shared its batches, nor on how many draft tokens the speculation
controller happened to choose at each step (that choice depends on measured
step times, which differ from run to run). So the random numbers used for
output position t are a pure function of (seed, t, stream): nothing is drawn
from a stateful generator whose state would depend on the history of draws.

The noise is a counter-based hash (two rounds of the `lowbias32` integer
finaliser over a Weyl sequence) computed with int32 tensor ops. That makes it
- independent of the device: the hash bits and uniforms are bit-identical on
  CPU and CUDA (only -log(u) may differ in the last ulp between libms),
- batchable: one set of elementwise kernels serves rows of different
  requests and positions, with no per-row generator objects or launches.

Sampling uses the exponential race (the Gumbel-max trick in another guise):
token = argmax_i p_i / E_i with E_i ~ Exp(1) i.i.d. picks token i with
probability exactly p_i. Unnormalised weights work too, which the verifier
uses for the rejection residual max(p - q, 0).
"""
from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from engine.request import SamplingOptions

_M32 = 0xFFFFFFFF


def _s32(v: int) -> int:
    """An unsigned 32-bit value as the signed int32 torch stores."""
    v &= _M32
    return v - (1 << 32) if v >= (1 << 31) else v


# lowbias32 (C. Wellons' hash prospector): a well-mixing 32-bit finaliser.
_MUL1 = 0x7FEB352D
_MUL2 = 0x846CA68B
_GOLDEN = 0x9E3779B9  # Weyl increment: odd, so i*G mod 2^32 is a bijection
_MUL1_S = _s32(_MUL1)
_MUL2_S = _s32(_MUL2)
_GOLDEN_S = _s32(_GOLDEN)
_SEED_SALT = 0x243F6A88  # digits of pi: just a fixed, non-zero salt
_K2_SALT = 0x85EBCA6B

# Independent streams of randomness per position. Each use of randomness gets
# its own stream so that no two decisions share noise (sharing would couple
# them and bias the verifier), except where sharing is deliberate (see
# STREAM_SAMPLE in engine/speculative/draft_model.py's "coupled" drafting).
STREAM_SAMPLE = 0  # exponential race of the target's own sample at position t
STREAM_ACCEPT = 1  # the uniform of the accept test for a stochastic draft at t
STREAM_RESIDUAL = 2  # exponential race over max(p - q, 0) after a rejection at t
STREAM_DRAFT = 3  # a stochastic draft model's own sample at t


def mix32(x: int) -> int:
    """lowbias32 on a Python int (the scalar twin of `_mix32_`)."""
    x &= _M32
    x ^= x >> 16
    x = (x * _MUL1) & _M32
    x ^= x >> 15
    x = (x * _MUL2) & _M32
    x ^= x >> 16
    return x


def _mix32_(x: Tensor) -> Tensor:
    """lowbias32, in place, on an int32 tensor.

    int32 multiplication wraps modulo 2^32 on CPU and CUDA; `>>` is an
    arithmetic shift on signed ints, so the sign-extended bits are masked off
    to get the logical shift the hash needs.
    """
    x ^= (x >> 16) & 0xFFFF
    x *= _MUL1_S
    x ^= (x >> 15) & 0x1FFFF
    x *= _MUL2_S
    x ^= (x >> 16) & 0xFFFF
    return x


@dataclass(frozen=True)
class NoiseKey:
    """Identifies one row of noise: (the request's seed-derived base, position, stream)."""

    base: int  # 32-bit, from RequestRng
    position: int  # output position, < 2^32
    stream: int


def derive_keys(base: int, position: int, stream: int) -> tuple[int, int]:
    """The two 32-bit keys (k1, k2) of a noise row; scalar twin of `_derive_keys_t`."""
    k = mix32(base ^ position)
    k = mix32(k ^ ((stream * _GOLDEN) & _M32))
    return k, mix32(k ^ _K2_SALT)


def _derive_keys_t(keys: Sequence[NoiseKey], device: torch.device | str) -> tuple[Tensor, Tensor]:
    """(k1, k2), each [n] int32 on `device`. Derived on the CPU with tensor ops
    (cheaper than per-row Python for large batches), then moved in one copy each."""
    base = torch.tensor([_s32(k.base) for k in keys], dtype=torch.int32)  # [n]
    pos = torch.tensor([_s32(k.position) for k in keys], dtype=torch.int32)  # [n]
    stream = torch.tensor([_s32(k.stream * _GOLDEN) for k in keys], dtype=torch.int32)  # [n]
    k = _mix32_(base ^ pos)
    k = _mix32_(k ^ stream)
    k2 = _mix32_(k ^ _s32(_K2_SALT))
    return k.to(device), k2.to(device)


def _bits_to_uniform_t(h: Tensor) -> Tensor:
    # 23 bits, offset by half a step: u in (0, 1) exactly representable in
    # float32, so -log(u) is finite and positive (no 0 or inf noise).
    return ((h >> 9) & 0x7FFFFF).to(torch.float32).add_(0.5).mul_(2.0**-23)


def _bits_to_uniform(h: int) -> float:
    return (((h >> 9) & 0x7FFFFF) + 0.5) * 2.0**-23


@dataclass
class RequestRng:
    """Randomness of one request, keyed by output position.

    seed None draws a random seed once; it is kept in `seed` so that it can be
    reported and reused (e.g. stored with the request for redelivery).
    """

    seed: int | None = None
    base: int = field(init=False, repr=False)  # 32-bit digest of the seed

    def __post_init__(self) -> None:
        if self.seed is None:
            self.seed = secrets.randbits(63)
        s = self.seed & 0xFFFFFFFFFFFFFFFF  # negative or huge seeds fold into 64 bits
        self.base = mix32(mix32((s & _M32) ^ _SEED_SALT) ^ (s >> 32))

    def key(self, position: int, stream: int = STREAM_SAMPLE) -> NoiseKey:
        """Key of the noise row for (seed, position, stream); position is the output index."""
        if not 0 <= position <= _M32:
            raise ValueError(f"position must be in [0, 2^32), got {position}")
        return NoiseKey(self.base, position, stream)

    def uniform(self, position: int, stream: int = STREAM_ACCEPT) -> float:
        """One uniform in (0, 1) for (position, stream); equals element 0 of that row's noise."""
        key = self.key(position, stream)
        k1, k2 = derive_keys(key.base, key.position, key.stream)
        return _bits_to_uniform(mix32(mix32(k1 ^ k2) ^ k1))

    def exponentials(
        self,
        positions: Sequence[int],
        vocab_size: int,
        device: torch.device | str = "cpu",
        stream: int = STREAM_SAMPLE,
    ) -> Tensor:
        """Exp(1) noise, one row per position. Returns [len(positions), V] float32."""
        return exponential_noise([self.key(p, stream) for p in positions], vocab_size, device)


def uniform_noise(keys: Sequence[NoiseKey], vocab_size: int, device: torch.device | str = "cpu") -> Tensor:
    """Uniform(0, 1) noise, one row per key. Returns [n, V] float32."""
    if not keys:
        return torch.empty(0, vocab_size, dtype=torch.float32, device=device)
    k1, k2 = _derive_keys_t(keys, device)
    k1, k2 = k1.unsqueeze(1), k2.unsqueeze(1)  # [n, 1]
    idx = torch.arange(vocab_size, dtype=torch.int32, device=device).mul_(_GOLDEN_S)  # [V]
    x = idx.unsqueeze(0) + k1  # [n, V]; a Weyl sequence per row, offset by the key
    x ^= k2
    _mix32_(x)
    x ^= k1
    _mix32_(x)
    return _bits_to_uniform_t(x)


def uniforms(keys: Sequence[NoiseKey], device: torch.device | str = "cpu") -> Tensor:
    """Element 0 of each key's uniform row, without computing the rest. Returns [n] float32."""
    if not keys:
        return torch.empty(0, dtype=torch.float32, device=device)
    k1, k2 = _derive_keys_t(keys, device)  # [n] each
    x = k1 ^ k2  # index 0: the Weyl term is 0
    _mix32_(x)
    x ^= k1
    _mix32_(x)
    return _bits_to_uniform_t(x)


def exponential_noise(keys: Sequence[NoiseKey], vocab_size: int, device: torch.device | str = "cpu") -> Tensor:
    """Exp(1) noise, one row per key. Returns [n, V] float32, all entries finite and > 0."""
    return uniform_noise(keys, vocab_size, device).log_().neg_()


def race(weights: Tensor, noise: Tensor) -> Tensor:
    """Exponential race: argmax_i w_i / E_i picks i with probability w_i / sum(w).

    weights [n, V] >= 0 (need not be normalised); noise [n, V] Exp(1).
    Returns [n] int64. Zero-weight tokens score 0 and never win unless the
    whole row is zero (callers guard that case).
    """
    return (weights / noise).argmax(dim=-1)


# ---------------------------------------------------------------- distributions


def _as_param_list(params: SamplingOptions | Sequence[SamplingOptions], n: int) -> list[SamplingOptions]:
    if isinstance(params, SamplingOptions):
        return [params] * n
    plist = list(params)
    if len(plist) != n:
        raise ValueError(f"got {len(plist)} SamplingOptions for {n} rows of logits")
    return plist


def target_probs(logits: Tensor, params: SamplingOptions | Sequence[SamplingOptions]) -> Tensor:
    """The distribution the target samples from, after temperature, min_p, top-k and top-p.

    logits [n, V]; params one SamplingOptions for all rows or one per row.
    Returns [n, V] float32 rows summing to 1. Greedy rows (temperature 0) are
    one-hot at the argmax: that is the distribution greedy decoding "samples".
    The verifier computes acceptance against exactly this distribution, which
    is what makes speculation lossless with respect to it.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [n, V], got shape {tuple(logits.shape)}")
    n, vocab = logits.shape
    plist = _as_param_list(params, n)
    if all(p.greedy for p in plist):
        # Nothing to sample: skip the softmax and filters entirely.
        return torch.zeros(n, vocab, device=logits.device).scatter_(1, logits.argmax(dim=-1, keepdim=True), 1.0)
    x = logits.float()  # [n, V]; copy-free when already float32, so never modified in place below
    device = x.device

    greedy_rows = [i for i, p in enumerate(plist) if p.greedy]
    temps = torch.tensor([1.0 if p.greedy else p.temperature for p in plist], device=device).unsqueeze(1)  # [n, 1]
    x = x / temps  # [n, V]

    min_ps = [p.min_p if 0.0 < p.min_p <= 1.0 else 0.0 for p in plist]
    if any(min_ps):
        # vLLM's order: min_p on the tempered distribution, before top-k/top-p (transformers' MinPLogitsWarper rule:
        # drop p_i < min_p * max p; the top token always stays).
        probs = x.softmax(dim=-1)  # [n, V]
        floor = torch.tensor(min_ps, device=device).unsqueeze(1) * probs.max(dim=-1, keepdim=True).values  # [n, 1]
        x = x.masked_fill(probs < floor, float("-inf"))

    top_ks = [p.top_k if 0 < p.top_k < vocab else 0 for p in plist]
    if any(top_ks):
        # Threshold at the k-th largest value of each row; rows without top-k
        # are exempted by `no_k`. Ties at the threshold are all kept:
        # deterministic, and never fewer than k tokens.
        kmax = max(top_ks)
        top_vals = x.topk(kmax, dim=-1).values  # [n, kmax]
        ks = torch.tensor([k if k else kmax for k in top_ks], device=device)  # [n]
        thresh = top_vals.gather(1, (ks - 1).unsqueeze(1))  # [n, 1]
        no_k = torch.tensor([k == 0 for k in top_ks], device=device).unsqueeze(1)  # [n, 1]
        x = torch.where(no_k | (x >= thresh), x, torch.full_like(x, float("-inf")))

    top_ps = [p.top_p if 0.0 < p.top_p < 1.0 else 1.0 for p in plist]
    if any(tp < 1.0 for tp in top_ps):
        # Keep the smallest prefix of tokens (by descending probability) whose
        # mass reaches top_p: drop a token when the mass strictly before it
        # already reaches top_p. The top token is always kept.
        sorted_x, order = x.sort(dim=-1, descending=True)  # [n, V]
        sorted_p = sorted_x.softmax(dim=-1)  # [n, V]
        mass_before = sorted_p.cumsum(dim=-1) - sorted_p  # [n, V]
        tp = torch.tensor(top_ps, device=device).unsqueeze(1)  # [n, 1]
        drop_sorted = mass_before >= tp  # [n, V]
        drop_sorted[:, 0] = False
        drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)  # [n, V]
        x = x.masked_fill(drop, float("-inf"))

    probs = x.softmax(dim=-1)  # [n, V]
    if greedy_rows:
        rows = torch.tensor(greedy_rows, device=device)
        onehot = torch.zeros(len(greedy_rows), vocab, device=device)
        onehot.scatter_(1, logits[rows].argmax(dim=-1, keepdim=True), 1.0)
        probs[rows] = onehot
    return probs


# ---------------------------------------------------------------- sampling


def sample_batch(
    logits: Tensor,
    params: Sequence[SamplingOptions],
    rngs: Sequence[RequestRng | None],
    positions: Sequence[int],
) -> list[int]:
    """One token per row. logits [n, V]; per row its params, rng and output position.

    Greedy rows take the argmax (rng may be None); sampled rows run the
    exponential race with the noise of (seed, position): the same token
    `sample_next` returns for that row alone, whatever the rest of the batch.
    """
    n, vocab = logits.shape
    if not (len(params) == len(rngs) == len(positions) == n):
        raise ValueError("sample_batch needs one params, rng and position per row of logits")
    out = logits.argmax(dim=-1)  # [n]; final for greedy rows
    sampled = [i for i in range(n) if not params[i].greedy]
    if sampled:
        keys: list[NoiseKey] = []
        for i in sampled:
            rng = rngs[i]
            if rng is None:
                raise ValueError(f"row {i} samples (temperature {params[i].temperature}) but has no RequestRng")
            keys.append(rng.key(positions[i], STREAM_SAMPLE))
        rows = torch.tensor(sampled, device=logits.device)
        probs = target_probs(logits[rows], [params[i] for i in sampled])  # [s, V]
        noise = exponential_noise(keys, vocab, logits.device)  # [s, V]
        out[rows] = race(probs, noise)
    return out.tolist()


def sample_next(logits: Tensor, params: SamplingOptions, rng: RequestRng | None, position: int) -> int:
    """The next token from logits [V] at output position `position`."""
    if logits.dim() != 1:
        raise ValueError(f"sample_next takes logits [V], got shape {tuple(logits.shape)}")
    return sample_batch(logits.unsqueeze(0), [params], [rng], [position])[0]
