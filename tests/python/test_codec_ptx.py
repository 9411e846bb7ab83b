"""The compressed backups' GPU coder is PTX generated from offload/coder/codec_kernels.cu (libuvm.so is built
without nvcc): the generated file must come from the source as it is, at a PTX version every CUDA 12
and 13 driver compiles, and the kernels must read the format as offload/coder/codec.hpp writes it."""
import hashlib
import re

from conftest import ROOT

OFFLOAD = ROOT / "offload" / "coder"


def constants(text: str) -> dict:
    """`constexpr ... kName = value;` lines whose value is a plain integer expression."""
    found = {}
    for name, value in re.findall(r"constexpr (?:unsigned|size_t|uint8_t) (k\w+) = ([^;]+);", text):
        value = re.sub(r"size_t\{(\d+)\}", r"\1", value).replace("u <<", " <<").replace("u;", "")
        try:
            found[name] = eval(value, {}, dict(found))  # noqa: S307 (our own sources)
        except (NameError, SyntaxError):
            pass
    return found


def test_the_ptx_was_generated_from_the_kernels_as_they_are():
    source = (OFFLOAD / "codec_kernels.cu").read_bytes()
    generated = (OFFLOAD / "codec_ptx.inc").read_text()
    recorded = re.search(r"^// source sha256: ([0-9a-f]{64})$", generated, re.M)
    assert recorded, "offload/coder/codec_ptx.inc names no source hash: run scripts/codec_ptx.sh"
    assert recorded.group(1) == hashlib.sha256(source).hexdigest(), (
        "offload/coder/codec_kernels.cu changed since offload/coder/codec_ptx.inc was generated: run scripts/codec_ptx.sh")
    assert re.search(r"^\.version 7\.0$", generated, re.M), "the PTX must be version 7.0 (CUDA 11 and later drivers)"
    for kernel in ("uvm_codec_choose", "uvm_codec_encode", "uvm_codec_decode"):
        assert f".entry {kernel}(" in generated


def test_the_kernels_read_the_format_the_reference_writes():
    reference = constants((OFFLOAD / "codec.hpp").read_text())
    kernels = constants((OFFLOAD / "codec_kernels.cu").read_text())
    shared = ["kChunkBytes", "kChunkWords", "kGroups", "kCodeOffset", "kEscapeOffset", "kEscapeCapacity",
              "kCodedBytes", "kWindow", "kMaxBase"]
    for name in shared:
        assert name in reference and name in kernels, name
        assert reference[name] == kernels[name], f"{name}: codec.hpp {reference[name]}, codec_kernels.cu {kernels[name]}"
    assert reference["kCodedBytes"] == 47104
