"""NVIDIA's nvCOMP coders on the bf16 weights uvm's compressed backups are made for, to set beside
uvm's own coder (bench/codec_bench.cpp, its "coder on device" row): how small each makes the weights
and how fast it codes them, device memory to device memory, on GPU 0.

    python bench/nvcomp_compare.py [--gib 1] [--reps 3] [--out results.json]

The weights: tensors of 8 MiB at a Llama-style model's scales (projections 0.02, norms and
embeddings 1, a head 0.002), normal, in bf16, as codec_bench.cpp lays them out. Each coder's output
is decoded again and must give every byte back. nvCOMP comes from its pip wheels
(nvidia-nvcomp-cu13 and nvidia-libnvcomp-cu13); a coder it refuses is reported, not counted.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

CODERS = [("ANS", {}), ("ANS", {"data_type": "<f2"}), ("Bitcomp", {}), ("Bitcomp", {"data_type": "<u2"}),
          ("GDeflate", {"algorithm_type": 0}), ("GDeflate", {}), ("Cascaded", {"data_type": "<u2"}), ("LZ4", {}),
          ("Zstd", {})]


def weights(nbytes: int):
    import torch
    scales = [0.02, 0.02, 0.02, 1.0, 0.02, 0.05, 0.002, 0.02]
    part = (8 << 20) // 2
    parts = [torch.randn(part, device="cuda", dtype=torch.float32, generator=None).mul_(scales[i % 8]).to(torch.bfloat16)
             for i in range(nbytes // (8 << 20))]
    return torch.cat(parts).view(torch.uint8)


def timed(call, reps: int):
    import torch
    seconds, result = [], None
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        result = call()
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", default="nvcomp_compare.json")
    args = parser.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("nvcomp_compare: no CUDA device is present")
        return 1
    from nvidia import nvcomp
    torch.manual_seed(0)
    data = weights(int(args.gib * (1 << 30)))
    nbytes = data.numel()
    source = nvcomp.as_array(data)
    rows = []
    for algorithm, options in CODERS:
        name = algorithm + "".join(f" {k}={v}" for k, v in options.items())
        try:
            codec = nvcomp.Codec(algorithm=algorithm, **options)
            encode_s, encoded = timed(lambda: codec.encode(source), args.reps)
            decode_s, decoded = timed(lambda: codec.decode(encoded), args.reps)
            back = torch.as_tensor(decoded, device="cuda").view(torch.uint8).reshape(-1)
            row = {"coder": name, "stored_ratio": encoded.buffer_size / nbytes, "encode_gbps": nbytes / encode_s / 1e9,
                   "decode_gbps": nbytes / decode_s / 1e9, "identical": bool(torch.equal(back, data))}
        except Exception as error:  # a coder this build refuses (an option it does not know): reported
            row = {"coder": name, "error": f"{type(error).__name__}: {error}"}
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
              "nvcomp": getattr(nvcomp, "__version__", "?"), "gib": args.gib, "reps": args.reps, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0 if all(r.get("identical", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
