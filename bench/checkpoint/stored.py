"""What uvm's compressed backups store of a real checkpoint's weights, in bf16.

The node bench draws its weights at a Llama-style model's scales; this takes a trained checkpoint's
instead. Each floating-point tensor is cast to bf16 (as a model served in bf16 holds it) and coded by
uvm's reference coder (offload/coder/codec.cpp, compiled here with bench/checkpoint/codec_shim.cpp; the GPU
kernels write the same bytes), two ways: each tensor as an allocation of its own, and all of them
packed one after the other, as PyTorch's caching allocator packs small tensors into its segments.
Every tensor is decoded again and compared.

    python3 bench/checkpoint/stored.py CHECKPOINT [--out FILE]

CHECKPOINT: a TorchScript file, a state_dict saved by torch.save, or a .safetensors file.
"""
import argparse
import ctypes
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def reference_coder(build_dir: Path) -> ctypes.CDLL:
    library = build_dir / "libuvm_codec_ref.so"
    subprocess.run(["g++", "-O2", "-std=c++17", "-shared", "-fPIC", "-o", str(library),
                    str(ROOT / "offload/coder/codec.cpp"), str(ROOT / "bench/checkpoint/codec_shim.cpp")], check=True)
    coder = ctypes.CDLL(str(library))
    coder.uvm_bench_stored_bytes.restype = ctypes.c_size_t
    coder.uvm_bench_stored_bytes.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int)]
    return coder


def load_tensors(path: Path) -> dict:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file
        return load_file(str(path))
    try:
        return dict(torch.jit.load(str(path), map_location="cpu").state_dict())
    except RuntimeError:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
        return dict(state.get("state_dict", state))


def stored(coder: ctypes.CDLL, data: torch.Tensor) -> tuple[int, bool]:
    raw = data.contiguous().view(torch.uint8)
    identical = ctypes.c_int(0)
    n = coder.uvm_bench_stored_bytes(raw.data_ptr(), raw.numel(), ctypes.byref(identical))
    return n, bool(identical.value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    tensors = {name: t.to(torch.bfloat16).contiguous() for name, t in load_tensors(args.checkpoint).items()
               if t.is_floating_point() and t.numel() > 0}
    with tempfile.TemporaryDirectory() as build:
        coder = reference_coder(Path(build))
        raw_bytes = sum(t.numel() * 2 for t in tensors.values())
        per_tensor, identical = 0, True
        for t in tensors.values():
            n, same = stored(coder, t)
            per_tensor += n
            identical &= same
        whole_chunks = {}  # each tensor of a chunk or more: its bytes and what it stores of them
        for name, t in tensors.items():
            if t.numel() * 2 >= 64 << 10:
                n, _ = stored(coder, t)
                whole_chunks[name] = {"shape": list(t.shape), "bf16_bytes": t.numel() * 2,
                                      "stored_fraction": round(n / (t.numel() * 2), 4)}
        packed, same = stored(coder, torch.cat([t.flatten() for t in tensors.values()]))
        identical &= same
    chunk = 64 << 10
    result = {
        "checkpoint": args.checkpoint.name,
        "sha256": hashlib.sha256(args.checkpoint.read_bytes()).hexdigest(),
        "tensors": len(tensors),
        "parameters": raw_bytes // 2,
        "tensors_of_a_chunk_or_more": sum(t.numel() * 2 >= chunk for t in tensors.values()),
        "bf16_bytes": raw_bytes,
        "stored_bytes_per_tensor": per_tensor,
        "stored_fraction_per_tensor": round(per_tensor / raw_bytes, 4),
        "stored_bytes_packed": packed,
        "stored_fraction_packed": round(packed / raw_bytes, 4),
        "bytes_identical": identical,
        "tensors_of_a_chunk_or_more_stored": whole_chunks,
        "torch": torch.__version__,
        "about": "uvm's reference coder (offload/coder/codec.cpp) on the checkpoint's floating-point tensors cast to "
                 "bf16: each tensor as an allocation of its own, and all packed one after the other; a tensor "
                 "or tail shorter than a 64 KiB chunk is kept raw.",
    }
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
