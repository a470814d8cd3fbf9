"""Our flat-batch decoder reproduces HF logits (fp32) for the supported families."""
from __future__ import annotations

import pytest
import torch
from _engine_factories import tiny_hf_model

from engine.kv_cache import KVCache
from engine.model import (
    AttentionMetadata,
    Decoder,
    SeqAttention,
    UnsupportedModelError,
    causal_mask_at_end,
)

torch.set_num_threads(1)


def run_chunks(model: Decoder, cache: KVCache, seqs: list[tuple[int, list[int], int]]) -> torch.Tensor:
    """One flat forward. seqs: (region start, tokens fed, positions already cached) -> logits of every row [T, V]."""
    ids, pos, slots, meta = [], [], [], []
    for start, tokens, cached in seqs:
        n = len(tokens)
        meta.append(
            SeqAttention(len(ids), n, start, cached + n, causal_mask_at_end(n, cached + n, "cpu") if n > 1 else None)
        )
        ids += tokens
        pos += range(cached, cached + n)
        slots += range(start + cached, start + cached + n)
    attn = AttentionMetadata(meta, torch.tensor(slots), cache)
    with torch.inference_mode():
        hidden = model(torch.tensor(ids), torch.tensor(pos), attn)  # [T, H]
        return model.compute_logits(hidden)


def cache_for(hf) -> KVCache:
    c = hf.config
    return KVCache(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, 256, torch.float32, "cpu")


@torch.inference_mode()
def hf_logits(hf, ids: list[int]) -> torch.Tensor:
    return hf(torch.tensor([ids])).logits[0]  # [S, V]


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "mistral", "phi3", "mixtral"])
def test_logits_match_hf_in_one_flat_batch(kind: str) -> None:
    hf = tiny_hf_model(kind)
    model = Decoder.from_hf(hf, 256)
    cache = cache_for(hf)
    a = torch.randint(0, 300, (17,)).tolist()
    b = torch.randint(0, 300, (9,)).tolist()
    c = torch.randint(0, 300, (1,)).tolist()
    # Three sequences of different lengths in one flat batch, each in its own region.
    got = run_chunks(model, cache, [(0, a, 0), (100, b, 0), (200, c, 0)])
    ref = torch.cat([hf_logits(hf, a), hf_logits(hf, b), hf_logits(hf, c)])
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "phi3", "mixtral"])
def test_chunked_prefill_and_decode_match_hf(kind: str) -> None:
    hf = tiny_hf_model(kind)
    model = Decoder.from_hf(hf, 256)
    cache = cache_for(hf)
    ids = torch.randint(0, 300, (30,)).tolist()
    ref = hf_logits(hf, ids)
    # Chunks of 11, 12, then single tokens: every chunk attends to the cached prefix
    # with the bottom-right aligned causal mask.
    rows = [run_chunks(model, cache, [(40, ids[0:11], 0)]), run_chunks(model, cache, [(40, ids[11:23], 11)])]
    rows += [run_chunks(model, cache, [(40, [ids[i]], i)]) for i in range(23, 30)]
    torch.testing.assert_close(torch.cat(rows), ref, atol=1e-4, rtol=0)


def test_rope_scaling_variant_matches_hf() -> None:
    rope = {
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    hf = tiny_hf_model("llama", rope_parameters=rope)
    model = Decoder.from_hf(hf, 256)
    ids = torch.randint(0, 300, (100,)).tolist()
    torch.testing.assert_close(run_chunks(model, cache_for(hf), [(0, ids, 0)]), hf_logits(hf, ids), atol=1e-4, rtol=0)


def test_phi3_longrope_matches_hf_within_its_original_context_and_serves_no_further() -> None:
    # HF moves to the long factors past the original context; ours are the short ones throughout.
    half = 16 // 2  # head_dim 16
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0 + i / half for i in range(half)],
            "long_factor": [4.0] * half, "original_max_position_embeddings": 128}
    hf = tiny_hf_model("phi3", rope_parameters=rope, max_position_embeddings=1024, original_max_position_embeddings=128)
    model = Decoder.from_hf(hf, 128)
    assert model.cfg.max_position_embeddings == 128
    ids = torch.randint(0, 300, (100,)).tolist()
    torch.testing.assert_close(run_chunks(model, cache_for(hf), [(0, ids, 0)]), hf_logits(hf, ids), atol=1e-4, rtol=0)


def test_a_mixtral_checkpoint_in_the_hubs_per_expert_layout_gives_the_same_logits() -> None:
    # The Hub's files name each expert's w1 (gate), w3 (up) and w2 (down); transformers 5 stacks them on load.
    hf = tiny_hf_model("mixtral")
    hub: dict[str, torch.Tensor] = {}
    for name, tensor in hf.state_dict().items():
        layer, _, rest = name.partition(".mlp.")
        if not rest:
            hub[name] = tensor
        elif rest == "gate.weight":
            hub[f"{layer}.block_sparse_moe.gate.weight"] = tensor
        elif rest == "experts.gate_up_proj":
            for x, rows in enumerate(tensor):
                gate, up = rows.chunk(2)
                hub[f"{layer}.block_sparse_moe.experts.{x}.w1.weight"] = gate
                hub[f"{layer}.block_sparse_moe.experts.{x}.w3.weight"] = up
        elif rest == "experts.down_proj":
            for x, down in enumerate(tensor):
                hub[f"{layer}.block_sparse_moe.experts.{x}.w2.weight"] = down
    model = Decoder.from_checkpoint(hf.config, hub, 64)
    ids = torch.randint(0, 300, (40,)).tolist()
    torch.testing.assert_close(run_chunks(model, cache_for(hf), [(0, ids, 0)]), hf_logits(hf, ids), atol=1e-4, rtol=0)


def test_weights_are_fused_and_tied() -> None:
    hf = tiny_hf_model("qwen2")  # tied embeddings
    model = Decoder.from_hf(hf, 64)
    assert model.lm_head is None
    qkv = model.layers[0].self_attn.qkv_proj
    assert qkv.weight.shape == (64 + 2 * 32, 64) and qkv.bias is not None  # qwen2: q/k/v biases


def test_unsupported_architecture_is_named() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    hf = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, architectures=["GPT2LMHeadModel"]))
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel.*supported: llama, mistral, qwen2, qwen3"):
        Decoder.from_hf(hf, 64)


def test_causal_mask_is_aligned_to_the_end() -> None:
    m = causal_mask_at_end(3, 5, "cpu")
    assert m.tolist() == [
        [True, True, True, False, False],
        [True, True, True, True, False],
        [True, True, True, True, True],
    ]


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_a_whole_sequence_attends_causally_without_a_mask(kind: str) -> None:
    hf = tiny_hf_model(kind)
    model = Decoder.from_hf(hf, 256)
    ids = torch.randint(0, 300, (23,)).tolist()
    masked = run_chunks(model, cache_for(hf), [(0, ids, 0)])  # explicit bottom-right mask
    seq = SeqAttention(0, len(ids), 0, len(ids), None)  # SDPA's is_causal
    attn = AttentionMetadata([seq], torch.arange(len(ids)), cache_for(hf))
    with torch.inference_mode():
        unmasked = model.compute_logits(model(torch.tensor(ids), torch.arange(len(ids)), attn))
    torch.testing.assert_close(unmasked, masked, atol=1e-5, rtol=0)
    torch.testing.assert_close(unmasked, hf_logits(hf, ids), atol=1e-4, rtol=0)


def test_rows_after_a_cached_prefix_need_a_mask() -> None:
    with pytest.raises(ValueError, match="need a mask"):
        SeqAttention(q_start=0, q_len=3, kv_start=0, kv_len=10, mask=None)
