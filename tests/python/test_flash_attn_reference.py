"""The flash_attn reference that lets Megatron's inference engine run in tests/peers, checked against
a naive attention written the obvious way (one sequence at a time, Python lists of key rows, float64).
Runs on the CPU wherever torch is installed; the CUDA-graph case needs a GPU."""
import importlib.util
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed here")

_PATH = Path(__file__).resolve().parents[1] / "peers" / "flash_attn_reference" / "flash_attn" / "__init__.py"
_spec = importlib.util.spec_from_file_location("flash_attn_reference", _PATH)
fa = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fa)

HEADS, HEADS_K, DIM, BLOCK = 8, 2, 16, 4
# The reference computes in float32 and the naive attention in float64. A CI run (2026-11-28) saw
# them 4.3e-5 apart where every other run had stayed under 1e-5: CPU sgemm need not give the same
# float32 rounding from one run to the next. A wrong mask or scale is off by far more than this.
CLOSE = {"atol": 1e-4, "rtol": 1e-4}


def naive(q_rows, key_rows, value_rows, scale, left=-1, right=-1):
    """q_rows (Lq, H, D), key/value_rows (Lk, Hk, D) of one sequence -> out (Lq, H, D), lse (H, Lq), float64."""
    lq, lk = q_rows.shape[0], key_rows.shape[0]
    out = torch.zeros(lq, HEADS, DIM, dtype=torch.float64)
    lse = torch.full((HEADS, lq), float("-inf"), dtype=torch.float64)
    for i in range(lq):
        position = i + lk - lq
        seen = [j for j in range(lk) if (right < 0 or j <= position + right) and (left < 0 or j >= position - left)]
        for h in range(HEADS):
            if not seen:
                continue
            kh = h // (HEADS // HEADS_K)
            logits = [float(q_rows[i, h].double() @ key_rows[j, kh].double()) * scale for j in seen]
            top = max(logits)
            total = sum(math.exp(x - top) for x in logits)
            lse[h, i] = top + math.log(total)
            for x, j in zip(logits, seen):
                out[i, h] += math.exp(x - top) / total * value_rows[j, kh].double()
    return out, lse


def paged(lengths, generator, spare_blocks=3):
    """A paged cache holding sequences of `lengths`, their blocks shuffled, -1 past each table's end."""
    per = [max(1, -(-n // BLOCK)) for n in lengths]
    width = max(per) + 1
    total = sum(per) + spare_blocks
    order = torch.randperm(total, generator=generator).tolist()
    table = torch.full((len(lengths), width), -1, dtype=torch.int32)
    for b, count in enumerate(per):
        table[b, :count] = torch.tensor([order.pop() for _ in range(count)], dtype=torch.int32)
    k_cache = torch.randn(total, BLOCK, HEADS_K, DIM, generator=generator)
    v_cache = torch.randn(total, BLOCK, HEADS_K, DIM, generator=generator)
    return k_cache, v_cache, table


def rows_of(cache, table, b, n):
    return torch.cat([cache[int(block)] for block in table[b] if block >= 0])[:n]


def cumulative(lengths):
    return torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)


@pytest.mark.parametrize("window", [(-1, -1), (3, -1)])
def test_varlen_paged_prefill_matches_naive(window):
    g = torch.Generator().manual_seed(1)
    q_lengths, k_lengths = [5, 1, 7, 3], [9, 1, 7, 12]  # prompts that continue earlier tokens, and a first chunk
    k_cache, v_cache, table = paged(k_lengths, g)
    padding = 4  # Megatron pads the token count; padded query rows must come back as zeros
    q = torch.randn(sum(q_lengths) + padding, HEADS, DIM, generator=g)
    out, lse, _ = fa.flash_attn_varlen_func(q, k_cache, v_cache, cumulative(q_lengths), cumulative(k_lengths),
                                            max(q_lengths), max(k_lengths), softmax_scale=0.3, causal=True,
                                            window_size=window, block_table=table, return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (HEADS, q.shape[0])
    start = 0
    for b, (lq, lk) in enumerate(zip(q_lengths, k_lengths)):
        want, want_lse = naive(q[start:start + lq], rows_of(k_cache, table, b, lk), rows_of(v_cache, table, b, lk),
                               0.3, left=window[0], right=0)
        torch.testing.assert_close(out[start:start + lq].double(), want, **CLOSE)
        torch.testing.assert_close(lse[:, start:start + lq].double(), want_lse, **CLOSE)
        start += lq
    assert torch.count_nonzero(out[start:]) == 0


def test_varlen_packed_keys_and_full_attention():
    g = torch.Generator().manual_seed(2)
    lengths = [3, 6]
    q = torch.randn(sum(lengths), HEADS, DIM, generator=g)
    k = torch.randn(sum(lengths), HEADS_K, DIM, generator=g)
    v = torch.randn(sum(lengths), HEADS_K, DIM, generator=g)
    cu = cumulative(lengths)
    out = fa.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=False)
    for b, n in enumerate(lengths):
        s = int(cu[b])
        want, _ = naive(q[s:s + n], k[s:s + n], v[s:s + n], DIM ** -0.5)
        torch.testing.assert_close(out[s:s + n].double(), want, **CLOSE)


@pytest.mark.parametrize("tokens_per_request", [1, 3])
def test_kvcache_paged_decode_matches_naive(tokens_per_request):
    g = torch.Generator().manual_seed(3)
    lengths = [6, 13, 0, 4]  # the 0 is a padded request slot: its output must be zeros
    k_cache, v_cache, table = paged([max(n, 1) for n in lengths], g)
    table[2] = -1
    q = torch.randn(len(lengths), tokens_per_request, HEADS, DIM, generator=g, dtype=torch.float32)
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    out, lse = fa.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table,
                                          causal=True, return_softmax_lse=True)
    assert out.shape == q.shape and lse.shape == (len(lengths), HEADS, tokens_per_request)
    for b, n in enumerate(lengths):
        if n == 0:
            assert torch.count_nonzero(out[b]) == 0
            continue
        want, want_lse = naive(q[b], rows_of(k_cache, table, b, n), rows_of(v_cache, table, b, n), DIM ** -0.5,
                               right=0)
        torch.testing.assert_close(out[b].double(), want, **CLOSE)
        torch.testing.assert_close(lse[b].double(), want_lse, **CLOSE)


def test_kvcache_writes_new_keys_where_the_sequence_ends():
    g = torch.Generator().manual_seed(4)
    lengths = [5, 2]
    k_cache, v_cache, table = paged([n + 2 for n in lengths], g)
    untouched_k, untouched_v = k_cache.clone(), v_cache.clone()
    q = torch.randn(2, 2, HEADS, DIM, generator=g)
    k_new = torch.randn(2, 2, HEADS_K, DIM, generator=g)
    v_new = torch.randn(2, 2, HEADS_K, DIM, generator=g)
    out = fa.flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new,
                                     cache_seqlens=torch.tensor(lengths, dtype=torch.int32), block_table=table,
                                     causal=True)
    changed = (k_cache != untouched_k).any(dim=(2, 3)).nonzero().tolist()
    expected = sorted([int(table[b, (n + i) // BLOCK]), (n + i) % BLOCK] for b, n in enumerate(lengths)
                      for i in range(2))
    assert sorted(changed) == expected, "new keys went somewhere else than the end of each sequence"
    for b, n in enumerate(lengths):
        torch.testing.assert_close(rows_of(k_cache, table, b, n + 2)[n:], k_new[b])
        torch.testing.assert_close(rows_of(v_cache, table, b, n + 2)[n:], v_new[b])
        want, _ = naive(q[b], rows_of(k_cache, table, b, n + 2), rows_of(v_cache, table, b, n + 2), DIM ** -0.5,
                        right=0)
        torch.testing.assert_close(out[b].double(), want, **CLOSE)
    assert torch.equal(v_cache != untouched_v, k_cache != untouched_k)


def test_bf16_rounds_once_at_the_end():
    g = torch.Generator().manual_seed(5)
    k_cache, v_cache, table = paged([7], g)
    q = torch.randn(1, 1, HEADS, DIM, generator=g)
    lengths = torch.tensor([7], dtype=torch.int32)
    exact = fa.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, block_table=table, causal=True)
    low = fa.flash_attn_with_kvcache(q.bfloat16(), k_cache.bfloat16(), v_cache.bfloat16(), cache_seqlens=lengths,
                                     block_table=table, causal=True)
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float(), exact, atol=0.05, rtol=0.05)


def test_what_it_does_not_do_raises():
    q = torch.zeros(2, HEADS, DIM)
    cu = torch.tensor([0, 2], dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="dropout"):
        fa.flash_attn_varlen_func(q, q[:, :HEADS_K], q[:, :HEADS_K], cu, cu, 2, 2, dropout_p=0.1)
    with pytest.raises(NotImplementedError, match="rotary"):
        fa.flash_attn_with_kvcache(q.view(1, 2, HEADS, DIM), q.view(1, 2, HEADS, DIM), q.view(1, 2, HEADS, DIM),
                                   rotary_cos=q)
    with pytest.raises(ValueError, match="multiple"):
        fa.flash_attn_varlen_func(q, torch.zeros(2, 3, DIM), torch.zeros(2, 3, DIM), cu, cu, 2, 2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the graph-capture case needs one")
def test_captured_decode_replays_with_new_lengths():
    """Megatron captures attention into CUDA graphs: the reference must not synchronise or branch on data."""
    g = torch.Generator().manual_seed(6)
    k_cache, v_cache, table = (t.cuda() for t in paged([16, 16, 16], g))
    q = torch.randn(3, 1, HEADS, DIM, generator=g).cuda()
    seqlens = torch.tensor([3, 9, 16], dtype=torch.int32, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fa.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table, causal=True)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fa.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table, causal=True)
    for lengths in ([3, 9, 16], [16, 1, 5]):
        seqlens.copy_(torch.tensor(lengths, dtype=torch.int32))
        graph.replay()
        eager = fa.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table, causal=True)
        torch.testing.assert_close(out, eager, atol=0, rtol=0)
