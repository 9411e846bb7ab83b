"""Streaming benchmark: a decoder whose weights are several times a GPU budget, run
forward with uvm.stream, beside what bounds it, in one process:

  resident        the model on the GPU: the compute floor
  link ideal      the streamed weight bytes / pinned host-to-device cudaMemcpyAsync bandwidth,
                  measured in the same run before and after the streamed forwards (the best copy
                  of either: single measures varied by 15 % on an H200)
  uvm, all        the layers streamed within --budget-gib, every layer rotating through it
                  (uvm.stream(..., keep_layers=False): every weight byte crosses the link)
  uvm.stream      the default: the first layers the budget holds beside a window of four stay on
                  the GPU, the others stream (its own link ideal: the bytes it moves a forward)
  accelerate      accelerate's cpu_offload (weights on the host, moved module by module)

    python -m uvm bench stream [--gib 12] [--budget-gib 4] [--layers 28] [--repeats 3] [--json FILE]
                               [--no-accelerate]

A Llama-style decoder in bf16 written here (RMSNorm, grouped-query attention through
scaled_dot_product_attention, SiLU-gated MLP; hidden 4096, MLP 14336, 32/8 heads), with as many
layers as --gib holds. Shapes: prefill (batch 4 x 512 tokens) and decode (batch 1 and 16, one new
token each, attending to itself: the weights streamed are the same as with a KV cache, and the
compute is the floor's). Every method's logits must equal the resident model's (uvm: bit for bit).
Managed memory left to page faults under the same budget is not run: a budget smaller than the
model is oversubscription of a smaller GPU, which these machines must never see. The layers are
releasable device memory, not managed; nothing here allocates managed memory.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time

import torch

import uvm

GiB = 1 << 30


class RMSNorm(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden, dtype=torch.bfloat16, device="cuda"))

    def forward(self, h):
        variance = h.float().pow(2).mean(-1, keepdim=True)
        return (h.float() * torch.rsqrt(variance + 1e-5)).to(h.dtype) * self.weight


class Layer(torch.nn.Module):
    def __init__(self, hidden, mlp, heads, kv_heads):
        super().__init__()
        self.heads, self.kv_heads, self.dim = heads, kv_heads, hidden // heads
        kv = kv_heads * self.dim
        make = lambda i, o: torch.nn.Linear(i, o, bias=False, dtype=torch.bfloat16, device="cuda")  # noqa: E731
        self.norm1, self.norm2 = RMSNorm(hidden), RMSNorm(hidden)
        self.q, self.k, self.v, self.o = make(hidden, hidden), make(hidden, kv), make(hidden, kv), make(hidden, hidden)
        self.gate, self.up, self.down = make(hidden, mlp), make(hidden, mlp), make(mlp, hidden)

    def forward(self, h):
        b, t, _ = h.shape
        x = self.norm1(h)
        q = self.q(x).view(b, t, self.heads, self.dim).transpose(1, 2)
        k = self.k(x).view(b, t, self.kv_heads, self.dim).transpose(1, 2)
        v = self.v(x).view(b, t, self.kv_heads, self.dim).transpose(1, 2)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=t > 1, enable_gqa=True)
        h = h + self.o(a.transpose(1, 2).reshape(b, t, -1))
        x = self.norm2(h)
        return h + self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


class Decoder(torch.nn.Module):
    def __init__(self, layers, hidden=4096, mlp=14336, heads=32, kv_heads=8, vocab=32000):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden, dtype=torch.bfloat16, device="cuda")
        self.layers = torch.nn.ModuleList(Layer(hidden, mlp, heads, kv_heads) for _ in range(layers))
        self.norm = RMSNorm(hidden)
        self.head = torch.nn.Linear(hidden, vocab, bias=False, dtype=torch.bfloat16, device="cuda")

    def forward(self, tokens):
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.head(self.norm(h[:, -1:]))


def layer_bytes(hidden=4096, mlp=14336, heads=32, kv_heads=8) -> int:
    kv = kv_heads * hidden // heads
    return 2 * (2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * mlp + 2 * hidden)


def versions() -> dict:
    found = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
             "device": torch.cuda.get_device_name(0)}
    smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True)
    found["driver"] = smi.stdout.strip()
    try:
        import accelerate
        found["accelerate"] = accelerate.__version__
    except ImportError:
        pass
    return found


def pinned_h2d_gbps(nbytes: int = 2 * GiB, repeats: int = 5) -> float:
    """The best of `repeats` pinned host-to-device copies: the link's speed, the strictest bound."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        device.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return nbytes / min(times) / 1e9


def timed(model, tokens, repeats: int) -> tuple[float, torch.Tensor]:
    with torch.no_grad():
        out = model(tokens)  # warm-up (and, streamed, the first fetches)
        times = []
        for _ in range(repeats):
            torch.cuda.synchronize()
            start = time.perf_counter()
            out = model(tokens)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    return statistics.median(times), out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=12.0, help="weight bytes of the streamed layers")
    parser.add_argument("--budget-gib", type=float, default=4.0)
    parser.add_argument("--layers", type=int, default=0, help="layers (default: as many as --gib holds)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-accelerate", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    layers = args.layers or max(1, int(args.gib * GiB // layer_bytes()))
    torch.manual_seed(0)
    model = Decoder(layers).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.02)
    streamed_bytes = sum(p.numel() * p.element_size() for p in model.layers.parameters())
    shapes = {"prefill b4x512": (4, 512), "decode b1": (1, 1), "decode b16": (16, 1)}
    tokens = {name: torch.randint(0, 32000, shape, device="cuda") for name, shape in shapes.items()}
    report = {"versions": versions(), "layers": layers, "streamed_gib": streamed_bytes / GiB,
              "budget_gib": args.budget_gib, "repeats": args.repeats, "rows": {}}
    bandwidth = pinned_h2d_gbps()
    report["pinned_h2d_gbps_before"] = bandwidth
    link = streamed_bytes / (bandwidth * 1e9)
    print(f"{report['versions']['device']}: {layers} layers, {streamed_bytes / GiB:.2f} GiB streamed, budget "
          f"{args.budget_gib} GiB; pinned H2D {bandwidth:.1f} GB/s: link ideal {link * 1e3:.1f} ms", flush=True)
    reference = {}
    for name in shapes:
        seconds, out = timed(model, tokens[name], args.repeats)
        reference[name] = out
        report["rows"][name] = {"resident_s": seconds, "link_ideal_s": link}
    budget = int(args.budget_gib * GiB)
    # Twice: every layer rotating through the budget (every byte crosses the link each forward),
    # then uvm.stream's default, which keeps the first layers the budget holds beside its window.
    for key, keep in (("uvm_all", False), ("uvm_stream", True)):
        with uvm.stream(model, budget_bytes=budget, keep_layers=keep) as streamed:
            kept_params = [p for i in streamed.kept_layers for p in streamed.layers[i].parameters()]
            moved = streamed_bytes - sum(p.numel() * p.element_size() for p in kept_params)
            report[f"{key}_kept_layers"] = len(streamed.kept_layers)
            report[f"{key}_moved_gib"] = moved / GiB
            for name in shapes:
                seconds, out = timed(model, tokens[name], args.repeats)
                row = report["rows"][name]
                row[f"{key}_s"] = seconds
                row[f"{key}_identical"] = bool(torch.equal(out, reference[name]))
                row[f"{key}_gbps"] = moved / seconds / 1e9
            report[f"{key}_peak_resident_gib"] = (streamed.peak_resident_bytes + streamed.rest_bytes) / GiB
    report["uvm_peak_resident_gib"] = max(report["uvm_all_peak_resident_gib"], report["uvm_stream_peak_resident_gib"])
    after = pinned_h2d_gbps()
    report["pinned_h2d_gbps_after"] = after
    report["pinned_h2d_gbps"] = bandwidth = max(bandwidth, after)
    link = streamed_bytes / (bandwidth * 1e9)
    link_moved = report["uvm_stream_moved_gib"] * GiB / (bandwidth * 1e9)
    for row in report["rows"].values():
        row["link_ideal_s"] = link
        row["link_ideal_moved_s"] = link_moved
    print(f"pinned H2D {report['pinned_h2d_gbps_before']:.1f} GB/s before, {after:.1f} after: link ideal "
          f"{link * 1e3:.1f} ms", flush=True)
    if not args.no_accelerate:
        try:
            from accelerate import cpu_offload
        except ImportError as error:
            report["accelerate_error"] = str(error)
        else:
            model.to("cpu")
            torch.cuda.empty_cache()
            cpu_offload(model, execution_device=torch.device("cuda:0"))
            for name in shapes:
                seconds, out = timed(model, tokens[name], args.repeats)
                row = report["rows"][name]
                row["accelerate_s"] = seconds
                row["accelerate_identical"] = bool(torch.equal(out, reference[name]))
    kept = report["uvm_stream_kept_layers"]
    print(f"uvm.stream keeps {kept} of {layers} layers on the GPU and moves {report['uvm_stream_moved_gib']:.2f} GiB "
          f"a forward: link ideal for those {link_moved * 1e3:.1f} ms; 'all' streams every layer")
    lines = ["| shape | resident (floor) | link ideal (all) | uvm, all streamed | / max(floor, ideal) | "
             f"uvm.stream ({kept} kept) | / max(floor, its ideal) | accelerate | accelerate / uvm.stream | "
             "accelerate / uvm all |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, row in report["rows"].items():
        row["uvm_all_over_bound"] = row["uvm_all_s"] / max(row["resident_s"], row["link_ideal_s"])
        row["uvm_over_bound"] = row["uvm_stream_s"] / max(row["resident_s"], row["link_ideal_moved_s"])
        acc = row.get("accelerate_s")
        if acc:
            row["accelerate_over_uvm"] = acc / row["uvm_stream_s"]
            row["accelerate_over_uvm_all"] = acc / row["uvm_all_s"]

        def cell(key):
            return (f"{row[key + '_s'] * 1e3:.1f} ms ({row[key + '_gbps']:.1f} GB/s"
                    f"{'' if row[key + '_identical'] else ', DIFFERENT'})")
        lines.append(f"| {name} | {row['resident_s'] * 1e3:.1f} ms | {row['link_ideal_s'] * 1e3:.1f} ms | "
                     f"{cell('uvm_all')} | {row['uvm_all_over_bound']:.2f} | {cell('uvm_stream')} | "
                     f"{row['uvm_over_bound']:.2f} | "
                     + (f"{acc * 1e3:.0f} ms | {row['accelerate_over_uvm']:.1f}x | {row['accelerate_over_uvm_all']:.1f}x |"
                        if acc else "- | - | - |"))
    print("\n".join(lines))
    print(f"uvm peak on the GPU (uvm's books, plus the resident rest): {report['uvm_peak_resident_gib']:.2f} GiB "
          f"of a {args.budget_gib} GiB budget")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    ok = all(row["uvm_stream_identical"] and row["uvm_all_identical"] for row in report["rows"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
