"""A plain-PyTorch reference of flash-attn 2's two inference entry points, for uvm's test harness only.

Megatron-Core's dynamic inference engine calls `flash_attn_varlen_func` (prefill over paged KV blocks)
and `flash_attn_with_kvcache` (paged decode). flash-attn itself cannot reach the GPU machine (no
network, hours of nvcc), so tests/peers puts this folder on the test process's path under the name
`flash_attn`. It follows flash-attn 2.7's documented contract, written from that contract:

  * q is (total_q, heads, dim) for varlen and (batch, seqlen_q, heads, dim) for the KV cache; keys and
    values are either packed like q or paged, (num_blocks, block_size, heads_k, dim), addressed by a
    block table (batch, max_blocks) whose unused entries may be -1;
  * heads is a multiple of heads_k (grouped-query attention: query head h reads key head h // group);
  * causal attention is aligned to the bottom-right corner: query i of a sequence with Lq queries and
    Lk keys sees keys up to i + Lk - Lq; a sliding window (left, right) limits that to
    [i + Lk - Lq - left, i + Lk - Lq + right] (-1 = unbounded), and causal means right = 0;
  * a query that sees no key (padding, an empty sequence) gives zeros.

It is exact (float32 scores, softmax, weighted sum; one rounding to q's dtype at the end), slow
compared with the real kernels, and has no data-dependent Python control flow or host
synchronisation, so Megatron can capture it into its inference CUDA graphs: every shape comes from
the arguments' shapes and the Python ints max_seqlen_q / max_seqlen_k, which Megatron sets to upper
bounds when it captures. What flash-attn offers beyond inference (dropout, ALiBi, rotary in the cache
call, a cache batch index, left padding) raises NotImplementedError instead of being approximated.
"""
from __future__ import annotations

import torch

# Megatron asks for flash-attn >= 2.7.3 before it uses dynamic batching; this is that contract's version.
__version__ = "2.7.4"


def _unsupported(what: str):
    raise NotImplementedError(f"flash_attn reference (uvm's test harness): {what} is not implemented")


def _window_bounds(causal: bool, window_size) -> tuple[int, int]:
    left, right = (int(window_size[0]), int(window_size[1])) if window_size is not None else (-1, -1)
    if causal:
        right = 0
    return left, right


def _gather_paged(cache: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """(batch, max_blocks * block_size, heads_k, dim): each sequence's blocks in table order."""
    blocks = cache[block_table.long().clamp(min=0)]
    batch, max_blocks, block_size = blocks.shape[:3]
    return blocks.reshape(batch, max_blocks * block_size, *cache.shape[2:])


def _gather_packed(packed: torch.Tensor, starts: torch.Tensor, width: int) -> torch.Tensor:
    """(batch, width, ...): rows starts[b] .. starts[b] + width of a packed tensor (clamped; masked later)."""
    index = (starts.long().view(-1, 1) + torch.arange(width, device=packed.device).view(1, -1))
    return packed[index.clamp(max=max(packed.shape[0] - 1, 0))]


def _attend(q, k, v, q_len, k_len, scale, left, right, softcap):
    """q (B, Sq, H, D), k/v (B, Sk, Hk, D), q_len/k_len (B,) -> out (B, Sq, H, D) in q's dtype, lse (B, H, Sq).

    Query row i < q_len[b] sits at key position i + k_len[b] - q_len[b]; rows beyond q_len and keys
    beyond k_len take no part."""
    batch, seq_q, heads, _ = q.shape
    seq_k, heads_k = k.shape[1], k.shape[2]
    if heads % heads_k:
        raise ValueError(f"flash_attn reference: {heads} query heads is not a multiple of {heads_k} key heads")
    group = heads // heads_k
    keys = k.float().repeat_interleave(group, dim=2)
    values = v.float().repeat_interleave(group, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), keys) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    device = q.device
    row = torch.arange(seq_q, device=device).view(1, seq_q, 1)
    col = torch.arange(seq_k, device=device).view(1, 1, seq_k)
    q_len = q_len.long().view(-1, 1, 1)
    k_len = k_len.long().view(-1, 1, 1)
    position = row + k_len - q_len
    visible = (row < q_len) & (col < k_len)
    if right >= 0:
        visible &= col <= position + right
    if left >= 0:
        visible &= col >= position - left
    scores = scores.masked_fill(~visible.unsqueeze(1), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    weights = torch.exp(scores - lse.unsqueeze(-1).clamp(min=torch.finfo(torch.float32).min))
    weights = weights.masked_fill(~visible.unsqueeze(1), 0.0)
    out = torch.einsum("bhqk,bkhd->bqhd", weights, values)
    return out.to(q.dtype), lse


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """Attention over a batch of sequences packed end to end (cu_seqlens_* are cumulative offsets, int32).

    Returns out (total_q, heads, dim); with return_attn_probs, (out, softmax_lse (heads, total_q), None)."""
    if dropout_p:
        _unsupported("dropout")
    if alibi_slopes is not None:
        _unsupported("ALiBi")
    del deterministic  # one exact result either way
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    left, right = _window_bounds(causal, window_size)
    starts_q = cu_seqlens_q[:-1]
    q_len = cu_seqlens_q[1:] - starts_q
    k_len = cu_seqlens_k[1:] - cu_seqlens_k[:-1]
    width_q = max(int(max_seqlen_q), 1)
    queries = _gather_packed(q, starts_q, width_q)
    if block_table is None:
        width_k = max(int(max_seqlen_k), 1)
        keys = _gather_packed(k, cu_seqlens_k[:-1], width_k)
        values = _gather_packed(v, cu_seqlens_k[:-1], width_k)
    else:
        keys, values = _gather_paged(k, block_table), _gather_paged(v, block_table)
    out_padded, lse_padded = _attend(queries, keys, values, q_len, k_len, scale, left, right, float(softcap))
    # Scatter the valid rows back to their packed places; rows past a sequence's length go to a spare slot.
    total_q = q.shape[0]
    row = torch.arange(width_q, device=q.device).view(1, -1)
    target = (starts_q.long().view(-1, 1) + row).masked_fill(row >= q_len.long().view(-1, 1), total_q)
    out = torch.zeros((total_q + 1, *q.shape[1:]), dtype=q.dtype, device=q.device)
    out.index_put_((target.reshape(-1),), out_padded.reshape(-1, *q.shape[1:]))
    out = out[:total_q]
    if not return_attn_probs:
        return out
    lse = torch.full((q.shape[1], total_q + 1), float("-inf"), dtype=torch.float32, device=q.device)
    lse[:, target.reshape(-1)] = lse_padded.permute(1, 0, 2).reshape(q.shape[1], -1)
    return out, lse[:, :total_q], None


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    """Attention of q (batch, seqlen_q, heads, dim) over each sequence's first cache_seqlens[b] cached keys.

    New keys/values k, v (batch, seqlen_new, heads_k, dim) are first written into the cache at
    cache_seqlens, in place, as flash-attn does. Returns out (batch, seqlen_q, heads, dim); with
    return_softmax_lse, (out, softmax_lse (batch, heads, seqlen_q))."""
    if rotary_cos is not None or rotary_sin is not None:
        _unsupported("rotary embedding inside the cache call")
    if cache_batch_idx is not None:
        _unsupported("cache_batch_idx")
    if cache_leftpad is not None:
        _unsupported("cache_leftpad")
    if alibi_slopes is not None:
        _unsupported("ALiBi")
    del rotary_interleaved, num_splits  # no rotary; splitting is a kernel's choice, not a result's
    batch, seq_q = q.shape[:2]
    if cache_seqlens is None:
        cache_len = torch.full((batch,), k_cache.shape[1], dtype=torch.int32, device=q.device)
    elif isinstance(cache_seqlens, int):
        cache_len = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)
    else:
        cache_len = cache_seqlens
    if (k is None) != (v is None):
        raise ValueError("flash_attn reference: k and v are given together or not at all")
    if k is not None:
        new = k.shape[1]
        slot = cache_len.long().view(-1, 1) + torch.arange(new, device=q.device).view(1, -1)
        if block_table is None:
            rows = torch.arange(batch, device=q.device).view(-1, 1).expand(-1, new)
            k_cache[rows, slot] = k
            v_cache[rows, slot] = v
        else:
            block_size = k_cache.shape[1]
            block = block_table.long().gather(1, slot // block_size)
            k_cache[block, slot % block_size] = k
            v_cache[block, slot % block_size] = v
        cache_len = cache_len + new
    if block_table is None:
        keys, values = k_cache[:batch], v_cache[:batch]
    else:
        keys, values = _gather_paged(k_cache, block_table), _gather_paged(v_cache, block_table)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    left, right = _window_bounds(causal, window_size)
    q_len = torch.full((batch,), seq_q, dtype=torch.int64, device=q.device)
    out, lse = _attend(q, keys, values, q_len, cache_len, scale, left, right, float(softcap))
    return (out, lse) if return_softmax_lse else out
