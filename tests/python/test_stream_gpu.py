"""GPU: uvm.stream — a module whose layers visit the GPU within a budget. Outputs must equal the
resident module's bit for bit (a Sequential, a decoder's blocks, Hugging Face's generate()), the
bytes on the GPU must stay within the budget by uvm's own books after every layer, the memory must
really leave, and pointers must not move. Needs torch with CUDA (skipped otherwise). No managed
memory: the layers live in releasable allocations, at most 128 MiB of weights."""
import copy
import ctypes
import sys

import pytest
from conftest import UVM_PATH

sys.path.insert(0, str(UVM_PATH))
import uvm  # noqa: E402

torch = pytest.importorskip("torch", reason="torch is not installed here")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)

MiB = 1 << 20


def linear_stack(layers=8, hidden=2048, dtype=torch.float16):
    torch.manual_seed(0)
    blocks = []
    for _ in range(layers):  # 8 MiB of weights a layer (hidden 2048): whole 2 MiB granules, no bias
        blocks.append(torch.nn.Sequential(torch.nn.Linear(hidden, hidden, bias=False, dtype=dtype, device="cuda"),
                                          torch.nn.GELU()))
    return torch.nn.Sequential(*blocks)


def watch_budget(streamed, budget):
    """After every layer's forward, uvm's count of the streamed bytes on the GPU, plus the spare
    memory uvm keeps for the next fetch, plus the rest."""
    seen = []
    for layer in streamed.layers:
        layer.register_forward_hook(lambda *_: seen.append(streamed.resident_bytes() + uvm.stats()["spare_bytes"] +
                                                           streamed.rest_bytes))
    return seen


def test_sequential_outputs_match_and_the_budget_holds():
    model = linear_stack()
    x = torch.randn(64, 2048, dtype=torch.float16, device="cuda")
    with torch.no_grad():
        expected = model(x)
    budget = 3 * 8 * MiB
    with torch.no_grad(), uvm.stream(model, budget_bytes=budget) as streamed:
        seen = watch_budget(streamed, budget)
        for _ in range(3):  # the second forward starts on layers the first one fetched ahead
            assert torch.equal(model(x), expected)
        assert len(seen) == 3 * 8
        assert max(seen) <= budget
        assert streamed.peak_resident_bytes <= budget
        assert min(seen) > 0
    # Undone: ordinary memory, same outputs, uvm holds nothing of it.
    lib = uvm.library()
    assert all(lib.uvm_allocation_info(p.data_ptr(), None, None, None) != 0 for p in model.parameters())
    lib.uvm_clear_last_error()
    assert uvm.residency(tag=streamed.tag)["allocations"] == 0
    with torch.no_grad():
        assert torch.equal(model(x), expected)


def test_the_memory_really_leaves_and_pointers_stay():
    model = linear_stack(layers=8, hidden=4096)  # 32 MiB a layer, 256 MiB in all
    torch.cuda.synchronize()
    free_resident, _ = torch.cuda.mem_get_info()
    x = torch.randn(8, 4096, dtype=torch.float16, device="cuda")
    with torch.no_grad(), uvm.stream(model, budget_bytes=3 * 32 * MiB) as streamed:
        torch.cuda.empty_cache()  # the original weights' blocks
        torch.cuda.synchronize()
        free_streamed, _ = torch.cuda.mem_get_info()
        assert free_streamed - free_resident >= 200 * MiB  # released to the driver, not cached
        pointers = [p.data_ptr() for p in model.parameters()]
        model(x)
        model(x)
        assert [p.data_ptr() for p in model.parameters()] == pointers
        # Streaming keeps a dropped layer's memory for the next fetch (spare memory): at most one
        # layer of it, and with it no more than the budget on the GPU (16 MiB for activations).
        torch.cuda.synchronize()
        assert uvm.stats()["spare_bytes"] <= 32 * MiB
        free_forward, _ = torch.cuda.mem_get_info()
        assert free_forward - free_resident >= (256 - 3 * 32 - 16) * MiB
    assert uvm.stats()["spare_bytes"] == 0  # undone: given back
    limit = ctypes.c_size_t(1)
    assert uvm.library().uvm_get_spare_limit(0, ctypes.byref(limit)) == 0 and limit.value == 0


def test_a_cuda_graph_of_a_streamed_layer_stays_valid():
    model = linear_stack()
    x = torch.randn(16, 2048, dtype=torch.float16, device="cuda")
    with torch.no_grad():
        expected = model[0](x)
    with torch.no_grad(), uvm.stream(model, budget_bytes=3 * 8 * MiB) as streamed:
        model(x)  # layer 0 is fetched ahead again for the next forward
        assert 0 in streamed._resident
        torch.cuda.current_stream().wait_event(streamed._arrived[0])
        graph = torch.cuda.CUDAGraph()
        static_x = x.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            model[0].forward(static_x)  # warm-up, without the hook
            with torch.cuda.graph(graph):
                static_y = model[0].forward(static_x)
        torch.cuda.current_stream().wait_stream(side)
        model(x)
        model(x)  # layer 0 dropped and fetched again, at the same address
        torch.cuda.current_stream().wait_event(streamed._arrived[0])
        graph.replay()
        assert torch.equal(static_y, expected)


@pytest.mark.parametrize("keep", [True, False])
def test_the_first_layers_the_budget_holds_stay_and_a_forward_fetches_only_the_rest(keep):
    """8 layers of 8 MiB in a budget of 6: beside a window of 4, layers 0 and 1 stay once fetched,
    so a forward fetches 6 layers, not 8; with keep_layers=False every layer rotates through."""
    model = linear_stack()
    x = torch.randn(64, 2048, dtype=torch.float16, device="cuda")
    with torch.no_grad():
        expected = model(x)
    budget = 6 * 8 * MiB
    with torch.no_grad(), uvm.stream(model, budget_bytes=budget, keep_layers=keep) as streamed:
        assert streamed.kept_layers == ([0, 1] if keep else [])
        fetched = []
        fetch = streamed._fetch
        streamed._fetch = lambda j: (fetched.append(j), fetch(j))
        seen = watch_budget(streamed, budget)
        assert torch.equal(model(x), expected)  # the first forward fetches every layer once
        for _ in range(3):
            fetched.clear()
            assert torch.equal(model(x), expected)
            assert sorted(fetched) == (list(range(2, 8)) if keep else list(range(8)))
            assert all(k in streamed._resident for k in streamed.kept_layers)
        assert max(seen) <= budget


class Block(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.norm = torch.nn.LayerNorm(hidden, dtype=torch.bfloat16, device="cuda")
        self.up = torch.nn.Linear(hidden, 4 * hidden, dtype=torch.bfloat16, device="cuda")
        self.down = torch.nn.Linear(4 * hidden, hidden, dtype=torch.bfloat16, device="cuda")

    def forward(self, h):
        return h + self.down(torch.nn.functional.gelu(self.up(self.norm(h))))


class Decoder(torch.nn.Module):
    """Embedding, a ModuleList of blocks, a head tied to the embedding (which stays resident)."""

    def __init__(self, vocab=1000, hidden=1024, layers=6):
        super().__init__()
        torch.manual_seed(1)
        self.embed = torch.nn.Embedding(vocab, hidden, dtype=torch.bfloat16, device="cuda")
        self.blocks = torch.nn.ModuleList(Block(hidden) for _ in range(layers))
        self.head = torch.nn.Linear(hidden, vocab, bias=False, dtype=torch.bfloat16, device="cuda")
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        h = self.embed(tokens)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def greedy(model, tokens, steps):
    for _ in range(steps):
        nxt = model(tokens)[:, -1].argmax(-1, keepdim=True)
        tokens = torch.cat([tokens, nxt], dim=1)
    return tokens


def test_a_decoders_blocks_stream_and_generation_matches():
    model = Decoder()
    prompt = torch.randint(0, 1000, (4, 32), device="cuda")
    with torch.no_grad():
        expected = greedy(model, prompt, 12)
    block_bytes = sum(p.numel() * p.element_size() for p in model.blocks[0].parameters())
    rest = model.embed.weight.numel() * 2
    budget = rest + 3 * (block_bytes + 2 * MiB)
    with torch.no_grad(), uvm.stream(model, budget_bytes=budget) as streamed:
        assert streamed.layers == list(model.blocks)
        assert streamed.rest_bytes == rest  # the tied embedding and head, counted once
        seen = watch_budget(streamed, budget)
        assert torch.equal(greedy(model, prompt, 12), expected)
        assert max(seen) <= budget


def test_hugging_face_generate_matches_the_resident_model():
    transformers = pytest.importorskip("transformers", reason="transformers is not installed here")
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=512, intermediate_size=1536, num_hidden_layers=6,
                                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(2)
    model = transformers.LlamaForCausalLM(config).to(device="cuda", dtype=torch.bfloat16).eval()
    prompt = torch.randint(0, 512, (2, 24), device="cuda")
    settings = dict(max_new_tokens=16, do_sample=False, pad_token_id=0)
    expected = model.generate(prompt, **settings)
    layer_bytes = sum(p.numel() * p.element_size() for p in model.model.layers[0].parameters())
    rest = sum(p.numel() * p.element_size() for p in model.parameters()) - 6 * layer_bytes
    budget = rest + 3 * (layer_bytes + 2 * MiB)
    with uvm.stream(model, budget_bytes=budget) as streamed:
        assert len(streamed.layers) == 6
        seen = watch_budget(streamed, budget)
        assert torch.equal(model.generate(prompt, **settings), expected)  # prefill, then decode steps
        assert max(seen) <= budget
    assert torch.equal(model.generate(prompt, **settings), expected)


def test_bad_use_fails_clearly():
    model = linear_stack(layers=4)
    with pytest.raises(ValueError, match="budget_bytes=1048576 cannot hold"):
        uvm.stream(model, budget_bytes=MiB)
    with pytest.raises(ValueError, match="positive int"):
        uvm.stream(model, budget_bytes=0)
    with pytest.raises(ValueError, match="no torch.nn.ModuleList"):
        uvm.stream(torch.nn.Linear(8, 8, device="cuda"), budget_bytes=64 * MiB)
    reference = copy.deepcopy(model)
    x = torch.randn(4, 2048, dtype=torch.float16, device="cuda")
    with uvm.stream(model, budget_bytes=2 * 8 * MiB):
        with pytest.raises(RuntimeError, match="inference only"):
            model(x)  # autograd would keep the weights for a backward after they are gone
        with torch.no_grad():
            assert torch.equal(model(x), reference(x))


def test_a_kv_cache_larger_than_its_budget_pages_requests_ahead_of_use():
    """The unified-memory level-1 use: 8 requests own 8 blocks of 1 MiB each in one cache of 64 MiB
    (managed); 2 run at a time, and 2 more come back while they run: 32 MiB of the cache on the GPU
    at most, half of it. Each step brings the next
    pair's blocks back on a side stream while the current pair decodes (writes its blocks), then
    sends the current pair's blocks away (offload: they changed, so they are copied). uvm's books
    must stay within the budget, and every block must hold every write made to it."""
    pool = uvm.create_unified_mempool()
    blocks, block_elems, per_request = 64, (1 << 20) // 2, 8
    with uvm.tag("kv-paged"), torch.cuda.use_mem_pool(pool):
        cache = torch.zeros(blocks, block_elems, dtype=torch.bfloat16, device="cuda")
    owned = [list(range(r * per_request, (r + 1) * per_request)) for r in range(8)]
    writes = [0] * blocks
    pairs = [(0, 1), (2, 3), (4, 5), (6, 7)] * 3
    budget = 32 * MiB  # the pair decoding and the pair coming back
    side = torch.cuda.Stream()
    main = torch.cuda.current_stream()
    uvm.offload([cache[b] for b in range(blocks)], stream=main)  # every request starts paused
    ready = torch.cuda.Event()
    uvm.onload([cache[b] for r in pairs[0] for b in owned[r]], stream=side)
    ready.record(side)
    seen = []
    for step, pair in enumerate(pairs):
        main.wait_event(ready)
        if step + 1 < len(pairs):  # the next pair, ahead of use, while this one decodes
            nxt = [cache[b] for r in pairs[step + 1] for b in owned[r]]
            side.wait_stream(main)  # its blocks were sent away on main: after that, not before
            uvm.onload(nxt, stream=side)
            ready = torch.cuda.Event()
            ready.record(side)
        for r in pair:  # decode: each request writes its blocks
            for b in owned[r]:
                cache[b].add_(1)
                writes[b] += 1
        seen.append(uvm.residency(tag="kv-paged")["device_bytes"])
        uvm.offload([cache[b] for r in pair for b in owned[r]], stream=main)
        seen.append(uvm.residency(tag="kv-paged")["device_bytes"])
    uvm.onload([cache[b] for b in range(blocks)], stream=main)
    torch.cuda.synchronize()
    assert max(seen) <= budget, [s // MiB for s in seen]
    for b in range(blocks):
        assert torch.all(cache[b] == writes[b]), f"block {b}: {cache[b][0].item()} instead of {writes[b]}"
    del cache
    uvm.release_pool(pool)


def unchanged_and_not_uvms(model, before):
    """Every weight as it was, in ordinary memory, and no forward hook left on the module."""
    lib = uvm.library()
    for (name, p), (_, value) in zip(model.named_parameters(), before):
        assert p.device == value.device, name
        assert torch.equal(p.data, value), name
        assert lib.uvm_allocation_info(p.data_ptr(), None, None, None) != 0, f"{name} still points into uvm memory"
    lib.uvm_clear_last_error()
    assert not any(module._forward_pre_hooks for module in model.modules())


def test_a_copy_that_fails_half_way_through_a_layer_leaves_every_weight_where_it_was(monkeypatch):
    """Issue 73: weights moved before the failing copy pointed into memory undo() then freed."""
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(1024, 1024, dtype=torch.float16, device="cuda"))
                                  for _ in range(3)])  # weight and bias in each layer
    before = [(name, p.detach().clone()) for name, p in model.named_parameters()]
    copies = {"count": 0}
    original_copy = torch.Tensor.copy_

    def copy_failing_at_the_fourth(self, source, *args, **kwargs):
        copies["count"] += 1
        if copies["count"] == 4:  # layer 1's bias: its weight was moved already
            raise RuntimeError("injected: the copy failed")
        return original_copy(self, source, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "copy_", copy_failing_at_the_fourth)
    with pytest.raises(RuntimeError, match="injected"):
        uvm.stream(model, budget_bytes=64 * MiB)
    monkeypatch.undo()
    unchanged_and_not_uvms(model, before)


def test_a_failure_after_every_layer_moved_removes_the_hooks_and_gives_everything_back(monkeypatch):
    """Issue 73: the hooks were registered before the spare limit's check, which could raise."""
    from uvm import _lib
    model = linear_stack(layers=3, hidden=1024)
    before = [(name, p.detach().clone()) for name, p in model.named_parameters()]
    real = _lib.library()

    class RefusingSpareLimit:
        def __getattr__(self, name):
            return getattr(real, name)

        def uvm_set_spare_limit(self, device, size):
            if size != 0:
                return real.uvm_set_spare_limit(10_000, size)  # refused by the library: no such device
            return real.uvm_set_spare_limit(device, size)

    monkeypatch.setattr(_lib, "library", lambda: RefusingSpareLimit())
    with pytest.raises(Exception):
        uvm.stream(model, budget_bytes=64 * MiB)
    monkeypatch.undo()
    unchanged_and_not_uvms(model, before)
