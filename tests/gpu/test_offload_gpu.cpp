// GPU 0 (needs concurrentManagedAccess; staged needs CUDA 13 discard): offload/onload through the C
// ABI. Data survives 50 cycles of each strategy bit for bit, and the offloaded bytes are reclaimable
// by a plain cudaMalloc of (reported free + 95 % of them), after which onload still restores them.
#include <algorithm>
#include <string>
#include <thread>
#include <memory>
#include <vector>

#include "gpu_support.hpp"

using gpu::GiB;
using gpu::Managed;
using gpu::MiB;

namespace {

// Fills `m` with a pattern that depends on `seed` and every byte's position.
std::vector<unsigned char> fill(Managed& m, unsigned seed) {
  std::vector<unsigned char> host(m.size);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<unsigned char>((i * 131 + seed) >> 3);
  CUDA_REQUIRE(cudaMemcpy(m.ptr, host.data(), host.size(), cudaMemcpyDefault));
  return host;
}

bool matches(const Managed& m, const std::vector<unsigned char>& expected) {
  std::vector<unsigned char> now(m.size);
  CUDA_REQUIRE(cudaMemcpy(now.data(), m.ptr, m.size, cudaMemcpyDefault));
  return now == expected;
}

// The first byte that differs, with how many differ, for a failure message; "" when all match.
std::string first_difference(const Managed& m, const std::vector<unsigned char>& expected, size_t piece) {
  std::vector<unsigned char> now(m.size);
  CUDA_REQUIRE(cudaMemcpy(now.data(), m.ptr, m.size, cudaMemcpyDefault));
  size_t first = now.size(), count = 0;
  for (size_t i = 0; i < now.size(); ++i) {
    if (now[i] == expected[i]) continue;
    if (first == now.size()) first = i;
    ++count;
  }
  if (count == 0) return "";
  return "byte " + std::to_string(first) + " (piece " + std::to_string(first / piece) + ", " +
         ((first / piece) % 2 ? "kept" : "moved") + "): " + std::to_string(now[first]) + " instead of " +
         std::to_string(expected[first]) + "; " + std::to_string(count) + " bytes differ";
}

bool discard_supported() {
  uvm_device_caps caps{};
  return uvm_device_capabilities(0, &caps) == UVM_OK && caps.discard_supported;
}

}  // namespace

TEST_CASE("50 offload/onload cycles of every strategy keep the bytes", "[gpu][offload]") {
  REQUIRE(gpu::concurrent_managed_access());
  Managed a(96 * MiB + 12345), b(3 * MiB);
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // Tensor-like pieces of `a` with small gaps, and all of `b`.
  std::vector<uvm_range> ranges;
  for (size_t at = 0; at + 1 * MiB <= a.size; at += 1 * MiB) ranges.push_back(uvm_range{a.ptr + at, 1 * MiB - 200});
  ranges.push_back(uvm_range{b.ptr, b.size});
  std::vector<uvm_strategy> strategies = {UVM_STRATEGY_AUTO, UVM_STRATEGY_MIGRATE};
  if (discard_supported()) strategies.push_back(UVM_STRATEGY_STAGED);
  for (uvm_strategy strategy : strategies) {
    INFO("strategy " << strategy);
    const auto expected_a = fill(a, strategy), expected_b = fill(b, strategy + 7);
    for (int cycle = 0; cycle < 50; ++cycle) {
      REQUIRE(uvm_offload_ranges(ranges.data(), ranges.size(), strategy, stream) == UVM_OK);
      REQUIRE(uvm_onload_ranges(ranges.data(), ranges.size(), stream) == UVM_OK);
    }
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    CHECK(matches(b, expected_b));
    // The 200-byte gaps were neither moved nor touched, so all of `a` up to its last whole MiB holds.
    std::vector<unsigned char> now(a.size);
    CUDA_REQUIRE(cudaMemcpy(now.data(), a.ptr, a.size, cudaMemcpyDefault));
    const size_t covered = (a.size / MiB) * MiB - 200;
    CHECK(std::equal(now.begin(), now.begin() + covered, expected_a.begin()));
  }
  uvm_residency r{};
  REQUIRE(uvm_get_residency(0, nullptr, &r) == UVM_OK);
  CHECK(r.staged_bytes == 0);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

TEST_CASE("offloaded memory is reclaimable, and onload restores it after the claim", "[gpu][offload]") {
  REQUIRE(gpu::concurrent_managed_access());
  const size_t bytes = std::min<size_t>(2 * GiB, gpu::managed_budget() / 2);
  std::vector<uvm_strategy> strategies = {UVM_STRATEGY_MIGRATE};
  if (discard_supported()) strategies.push_back(UVM_STRATEGY_STAGED);
  for (uvm_strategy strategy : strategies) {
    INFO("strategy " << strategy);
    Managed m(bytes);
    CUDA_REQUIRE(cudaMemset(m.ptr, 0x5A, m.size));
    const uvm_range r{m.ptr, m.size};
    REQUIRE(uvm_offload_ranges(&r, 1, strategy, nullptr) == UVM_OK);
    CUDA_REQUIRE(cudaDeviceSynchronize());
    uvm_residency residency{};
    REQUIRE(uvm_get_residency(0, nullptr, &residency) == UVM_OK);
    CHECK(residency.host_bytes >= bytes);
    size_t free_bytes = 0, total = 0;
    CUDA_REQUIRE(cudaMemGetInfo(&free_bytes, &total));
    void* plain = nullptr;
    const size_t request = free_bytes + bytes / 100 * 95;
    const cudaError_t e = cudaMalloc(&plain, request);
    INFO("cudaMalloc(" << (request >> 20) << " MiB) with " << (free_bytes >> 20) << " MiB reported free: "
                       << cudaGetErrorName(e));
    (void)cudaGetLastError();
    CHECK(e == cudaSuccess);
    if (plain) {
      CUDA_REQUIRE(cudaMemset(plain, 0x11, request));
      CUDA_REQUIRE(cudaFree(plain));
    }
    REQUIRE(uvm_onload_ranges(&r, 1, nullptr) == UVM_OK);
    CUDA_REQUIRE(cudaDeviceSynchronize());
    std::vector<unsigned char> back(64 * MiB);
    for (size_t at = 0; at < m.size; at += m.size / 4) {  // a few windows across the range
      const size_t n = std::min(back.size(), m.size - at);
      CUDA_REQUIRE(cudaMemcpy(back.data(), m.ptr + at, n, cudaMemcpyDefault));
      CHECK(std::all_of(back.begin(), back.begin() + n, [](unsigned char c) { return c == 0x5A; }));
    }
  }
}

TEST_CASE("after a staged cycle the pages are not discardable: migrating them to the CPU keeps the data",
          "[gpu][offload]") {
  // The sequence that lost data before onload prefetched each chunk after its copy: staged offload,
  // onload while the driver still holds the discarded pages, then a prefetch to the CPU, which
  // dropped (read back as zeros) the pages the driver still counted as discarded.
  REQUIRE(gpu::concurrent_managed_access());
  if (!discard_supported()) {
    WARN("not run: staged offload needs CUDA 13 discard");
    return;
  }
  Managed big(std::min<size_t>(512 * MiB, gpu::managed_budget() / 2)), small(40 * MiB + 4096);
  const std::vector<uvm_range> ranges = {{big.ptr, big.size}, {small.ptr, small.size}};
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (unsigned cycle = 0; cycle < 3; ++cycle) {
    INFO("cycle " << cycle);
    const auto expected_big = fill(big, 11 + cycle), expected_small = fill(small, 29 + cycle);
    REQUIRE(uvm_offload_ranges(ranges.data(), 2, UVM_STRATEGY_STAGED, stream) == UVM_OK);
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    REQUIRE(uvm_onload_ranges(ranges.data(), 2, stream) == UVM_OK);
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    REQUIRE(uvm_offload_ranges(ranges.data(), 2, UVM_STRATEGY_MIGRATE, stream) == UVM_OK);
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    // Read where the data now is, on the CPU, before anything moves it back.
    CHECK(std::equal(expected_big.begin(), expected_big.end(), big.ptr));
    CHECK(std::equal(expected_small.begin(), expected_small.end(), small.ptr));
    REQUIRE(uvm_onload_ranges(ranges.data(), 2, stream) == UVM_OK);
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    CHECK(matches(big, expected_big));
    CHECK(matches(small, expected_small));
  }
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

TEST_CASE("pieces written on the GPU while their 512-byte neighbours are offloaded keep their values",
          "[gpu][offload][safety]") {
  // A real run lost 31 of 32 such pieces when 512-byte gaps were merged into the offload.
  REQUIRE(gpu::concurrent_managed_access());
  std::vector<uvm_strategy> strategies = {UVM_STRATEGY_AUTO, UVM_STRATEGY_MIGRATE};
  if (discard_supported()) strategies.push_back(UVM_STRATEGY_STAGED);
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (const size_t piece : {size_t{512}, size_t{1024}, size_t{4096}, size_t{3 * MiB}}) {
    for (uvm_strategy strategy : strategies) {
      INFO("piece " << piece << ", strategy " << strategy);
      Managed m(64 * piece);
      auto expected = fill(m, static_cast<unsigned>(piece + strategy));
      std::vector<uvm_range> moved;
      for (size_t i = 0; i < 64; i += 2) moved.push_back(uvm_range{m.ptr + i * piece, piece});
      REQUIRE(uvm_offload_ranges(moved.data(), moved.size(), strategy, stream) == UVM_OK);
      for (size_t i = 1; i < 64; i += 2) {  // the kept pieces, written on the GPU meanwhile
        CUDA_REQUIRE(cudaMemsetAsync(m.ptr + i * piece, static_cast<int>(i), piece, stream));
        std::fill(expected.begin() + i * piece, expected.begin() + (i + 1) * piece, static_cast<unsigned char>(i));
      }
      REQUIRE(uvm_onload_ranges(moved.data(), moved.size(), stream) == UVM_OK);
      CUDA_REQUIRE(cudaStreamSynchronize(stream));
      CHECK(first_difference(m, expected, piece) == "");
    }
  }
  CUDA_REQUIRE(cudaStreamDestroy(stream));
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}

TEST_CASE("small-tensor segments share slabs: a cycle keeps every byte, a kept tensor and a reused slot too",
          "[gpu][offload][safety][slabs]") {
  // 40 segments of 2 MiB (a slab of 32 and 8 of the next), four 512 KiB tensors each, as PyTorch
  // packs them. All but one tensor are offloaded (staged: one populate reaches across segments),
  // the kept one is written on the GPU meanwhile; then a migrate cycle, read on the CPU. Then the
  // segments are freed while staged and allocated again: new data copied in must survive a
  // migration (a slot the driver may count as discarded is never handed out again).
  REQUIRE(gpu::concurrent_managed_access());
  if (!discard_supported()) {
    WARN("not run: staged offload needs CUDA 13 discard");
    return;
  }
  constexpr size_t kSegment = 2 * MiB, kTensor = kSegment / 4;
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Managed holder(kSegment);  // keeps the first slab alive when the others are freed
  std::vector<std::unique_ptr<Managed>> segments;
  std::vector<unsigned char> expected;
  for (int i = 0; i < 40; ++i) {
    segments.push_back(std::make_unique<Managed>(kSegment));
    const auto bytes = fill(*segments.back(), 100 + i);
    expected.insert(expected.end(), bytes.begin(), bytes.end());
  }
  unsigned char* kept = segments[5]->ptr + 2 * kTensor;
  std::vector<uvm_range> moved;
  for (auto& segment : segments) {
    for (size_t k = 0; k < 4; ++k) {
      if (segment->ptr + k * kTensor != kept) moved.push_back(uvm_range{segment->ptr + k * kTensor, kTensor});
    }
  }
  const auto all_match = [&] {
    bool ok = true;
    for (size_t i = 0; i < segments.size(); ++i) {
      std::vector<unsigned char> now(kSegment);
      CUDA_REQUIRE(cudaMemcpy(now.data(), segments[i]->ptr, kSegment, cudaMemcpyDefault));
      ok = ok && std::equal(now.begin(), now.end(), expected.begin() + i * kSegment);
    }
    return ok;
  };
  REQUIRE(uvm_offload_ranges(moved.data(), moved.size(), UVM_STRATEGY_STAGED, stream) == UVM_OK);
  CUDA_REQUIRE(cudaMemsetAsync(kept, 0x3C, kTensor, stream));
  std::fill(expected.begin() + 5 * kSegment + 2 * kTensor, expected.begin() + 5 * kSegment + 3 * kTensor, 0x3C);
  REQUIRE(uvm_onload_ranges(moved.data(), moved.size(), stream) == UVM_OK);
  CUDA_REQUIRE(cudaStreamSynchronize(stream));
  CHECK(all_match());
  REQUIRE(uvm_offload_ranges(moved.data(), moved.size(), UVM_STRATEGY_MIGRATE, stream) == UVM_OK);
  CUDA_REQUIRE(cudaStreamSynchronize(stream));
  CHECK(all_match());
  REQUIRE(uvm_onload_ranges(moved.data(), moved.size(), stream) == UVM_OK);
  CUDA_REQUIRE(cudaStreamSynchronize(stream));
  CHECK(all_match());

  // Freed while staged, allocated again, data copied in, migrated: nothing lost.
  REQUIRE(uvm_offload_ranges(moved.data(), moved.size(), UVM_STRATEGY_STAGED, stream) == UVM_OK);
  CUDA_REQUIRE(cudaStreamSynchronize(stream));
  segments.clear();
  expected.clear();
  for (int i = 0; i < 40; ++i) {
    segments.push_back(std::make_unique<Managed>(kSegment));
    const auto bytes = fill(*segments.back(), 200 + i);
    expected.insert(expected.end(), bytes.begin(), bytes.end());
  }
  std::vector<uvm_range> whole;
  for (auto& segment : segments) whole.push_back(uvm_range{segment->ptr, kSegment});
  REQUIRE(uvm_offload_ranges(whole.data(), whole.size(), UVM_STRATEGY_MIGRATE, stream) == UVM_OK);
  CUDA_REQUIRE(cudaStreamSynchronize(stream));
  CHECK(all_match());
  segments.clear();
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

TEST_CASE("a staging block bigger than the set it now holds gives back its unused steps; copies go on",
          "[gpu][offload][staging]") {
  // 600 MiB staged once (a block pinned in three 256 MiB steps, when UVM_PINNED asks for the
  // registered way), then only 10 MiB: the two steps past the first are unregistered and unmapped
  // in the background while the first step keeps serving copies. Every byte survives each cycle.
  REQUIRE(gpu::concurrent_managed_access());
  if (!discard_supported()) {
    WARN("not run: staged offload needs CUDA 13 discard");
    return;
  }
  REQUIRE(uvm_release_staging() == UVM_OK);
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Managed small(10 * MiB), big(590 * MiB);
  const auto small_bytes = fill(small, 7), big_bytes = fill(big, 9);
  const uvm_range both[] = {{small.ptr, small.size}, {big.ptr, big.size}};
  REQUIRE(uvm_offload_ranges(both, 2, UVM_STRATEGY_STAGED, stream) == UVM_OK);
  REQUIRE(uvm_onload_ranges(both, 2, stream) == UVM_OK);
  CUDA_REQUIRE(cudaStreamSynchronize(stream));
  uvm_staging_info before{};
  REQUIRE(uvm_get_staging_info(&before) == UVM_OK);
  const bool in_steps = before.configured_kind == UVM_PINNED_REGISTERED && before.registered_bytes >= 600 * MiB;
  for (int round = 0; round < 3; ++round) {
    REQUIRE(uvm_offload_ranges(both, 1, UVM_STRATEGY_STAGED, stream) == UVM_OK);
    REQUIRE(uvm_release_staging() == UVM_OK);  // waits for the steps given back in the background
    uvm_staging_info after{};
    REQUIRE(uvm_get_staging_info(&after) == UVM_OK);
    if (in_steps) CHECK(after.capacity_bytes == 256 * MiB);
    REQUIRE(uvm_onload_ranges(both, 1, stream) == UVM_OK);
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    CHECK(matches(small, small_bytes));
    REQUIRE(uvm_offload_ranges(both, 2, UVM_STRATEGY_STAGED, stream) == UVM_OK);  // grows again
    REQUIRE(uvm_onload_ranges(both, 2, stream) == UVM_OK);
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    CHECK(matches(small, small_bytes));
    CHECK(matches(big, big_bytes));
  }
  if (!in_steps) WARN("staging was not pinned in steps (UVM_PINNED): the trim itself was not exercised");
  REQUIRE(uvm_release_staging() == UVM_OK);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

TEST_CASE("threads moving the same ranges on their own streams lose nothing", "[gpu][offload][safety][threads]") {
  REQUIRE(gpu::concurrent_managed_access());
  Managed m(32 * MiB);
  const auto expected = fill(m, 42);
  std::vector<uvm_range> ranges;
  for (size_t at = 0; at < m.size; at += 4 * MiB) ranges.push_back(uvm_range{m.ptr + at, 3 * MiB});
  std::vector<uvm_strategy> strategies = {UVM_STRATEGY_MIGRATE, UVM_STRATEGY_AUTO};
  if (discard_supported()) strategies = {UVM_STRATEGY_STAGED, UVM_STRATEGY_STAGED, UVM_STRATEGY_MIGRATE, UVM_STRATEGY_AUTO};
  std::vector<int> failures(strategies.size(), 0);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < strategies.size(); ++t) {
    threads.emplace_back([&, t] {  // Catch2 assertions are not thread-safe: count, check after
      cudaStream_t stream;
      if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) { ++failures[t]; return; }
      for (int i = 0; i < 25; ++i) {
        failures[t] += uvm_offload_ranges(ranges.data(), ranges.size(), strategies[t], stream) != UVM_OK;
        failures[t] += uvm_onload_ranges(ranges.data(), ranges.size(), stream) != UVM_OK;
      }
      failures[t] += cudaStreamSynchronize(stream) != cudaSuccess;
      cudaStreamDestroy(stream);
    });
  }
  for (auto& thread : threads) thread.join();
  for (int f : failures) CHECK(f == 0);
  REQUIRE(uvm_onload_ranges(ranges.data(), ranges.size(), nullptr) == UVM_OK);
  CUDA_REQUIRE(cudaDeviceSynchronize());
  CHECK(matches(m, expected));
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}

namespace {

const uvm_move_phase* phase_named(const uvm_move_report& report, const char* name) {
  for (size_t i = 0; i < report.phase_count; ++i) {
    if (std::string(report.phases[i].name) == name) return &report.phases[i];
  }
  return nullptr;
}

// A report's phases, for a failure message.
std::string describe(const uvm_move_report& report) {
  std::string text = std::string(report.call ? report.call : "(none)") + " " + std::to_string(report.bytes) +
                     " bytes in " + std::to_string(report.seconds) + " s:";
  for (size_t i = 0; i < report.phase_count; ++i) {
    const uvm_move_phase& p = report.phases[i];
    text += std::string(" ") + p.name + " " + std::to_string(p.bytes) + " B at +" + std::to_string(p.start) +
            " s for " + std::to_string(p.seconds) + " s;";
  }
  return text;
}

// Timed on the GPU and placed on the host clock: each phase inside the call's span, the copies
// taking a time no link could beat (their speed itself is the benchmarks' business: under
// compute-sanitizer they run at 2 GB/s).
void check_timeline(const uvm_move_report& report, const char* copy_phase, size_t bytes) {
  INFO(describe(report));
  REQUIRE(report.status == UVM_OK);
  CHECK(report.bytes == bytes);
  CHECK(report.host_seconds > 0);
  CHECK(report.seconds >= report.host_seconds);
  for (size_t i = 0; i < report.phase_count; ++i) {
    CHECK(report.phases[i].start >= -1e-3);  // the epoch's error is microseconds
    CHECK(report.phases[i].start + report.phases[i].seconds <= report.seconds + 1e-3);
  }
  const uvm_move_phase* copy = phase_named(report, copy_phase);
  REQUIRE(copy != nullptr);
  CHECK(copy->bytes == bytes);
  REQUIRE(copy->seconds > 0);
  CHECK(copy->bytes / copy->seconds / 1e9 < 1000);
}

}  // namespace

TEST_CASE("each move reports its phases, timed on the GPU, and the data survives", "[gpu][offload][trace]") {
  REQUIRE(gpu::concurrent_managed_access());
  if (!discard_supported()) {
    WARN("not run: staged offload needs CUDA 13 discard");
    return;
  }
  Managed m(256 * MiB);
  const auto expected = fill(m, 5);
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const uvm_range whole{m.ptr, m.size};
  REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_STAGED, stream) == UVM_OK);
  uvm_move_report report{};
  REQUIRE(uvm_last_move(0, &report) == UVM_OK);  // waits for the copies
  check_timeline(report, "copy", m.size);
  REQUIRE(phase_named(report, "discard") != nullptr);
  CHECK(phase_named(report, "discard")->start >= phase_named(report, "copy")->start);

  REQUIRE(uvm_onload_ranges(&whole, 1, stream) == UVM_OK);
  REQUIRE(uvm_last_move(UVM_ANY_DEVICE, &report) == UVM_OK);
  check_timeline(report, "copy", m.size);
  REQUIRE(phase_named(report, "populate") != nullptr);
  CHECK(phase_named(report, "populate")->bytes == m.size);
  CUDA_REQUIRE(cudaStreamSynchronize(stream));
  CHECK(matches(m, expected));

  void* releasable = uvm_malloc_releasable(64 * MiB, 0, nullptr);
  REQUIRE(releasable != nullptr);
  const uvm_range all{releasable, 64 * MiB};
  REQUIRE(uvm_offload_ranges(&all, 1, UVM_STRATEGY_AUTO, stream) == UVM_OK);
  REQUIRE(uvm_last_move(0, &report) == UVM_OK);
  check_timeline(report, "copy", 64 * MiB);
  CHECK(phase_named(report, "release") != nullptr);
  REQUIRE(uvm_onload_ranges(&all, 1, stream) == UVM_OK);
  REQUIRE(uvm_last_move(0, &report) == UVM_OK);
  check_timeline(report, "copy", 64 * MiB);
  CHECK(phase_named(report, "map") != nullptr);
  CUDA_REQUIRE(cudaStreamSynchronize(stream));
  uvm_free(releasable, 64 * MiB, 0, nullptr);
  CUDA_REQUIRE(cudaStreamDestroy(stream));
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}
