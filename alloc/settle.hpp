// Settling the driver after a wake, on a thread of uvm's.
//
// After a large free (a training step's memory given back just before a wake), the driver takes the
// freed memory back in the background for a while, and the first cuMemCreate or cuMemRelease after
// that work has gone on waits for it, once (the figures: docs/measurements.md, "The drop-in at the
// native calls' speed"; bench/probes/first_release_probe.py). A wake that maps new memory during that time
// leaves the wait to whoever makes or gives back memory next: usually the next sleep's first
// release, where a pause with nothing to copy has no copy to hide it behind.
//
// So once a wake has made new physical memory, this thread makes and gives back the smallest
// physical allocation on that device now and then, starting a little after the wake's last map (its
// copies done by then) and for a while after it, so that the wait is paid beside the model's work
// (kernel launches did not wait for it in the probe). A release on the device ends the polls: whoever
// releases pays what is left, as without them. Best effort: a poll the driver refuses is dropped
// silently. UVM_SETTLE=0 turns it off.
#pragma once

#include <chrono>

namespace uvm {

// Notes that a wake made new physical memory on `device` just now (vmm_map). Never throws.
void settle_after_wake(int device) noexcept;

// Notes that memory of `device` is being given back: its polls end.
void settle_cancel(int device) noexcept;

// When the polls run: the first `first` after the wake's last map, then every `every`, none later
// than `window` after that map.
struct SettleTiming {
  std::chrono::milliseconds first, every, window;
};

// For tests: other timing (the default: settle.cpp; a window of zero: no polls at all), and
// waiting until no poll is pending.
void set_settle_timing_for_test(SettleTiming timing);
void wait_until_settled();

// For tests: a clock that moves only when told (true), so that no test waits for time to pass or
// depends on how fast the host is; switching clocks ends the pending polls. advance moves it on
// and returns once every poll due by then has run; settling says whether any poll is pending.
void set_settle_clock_for_test(bool manual);
void advance_settle_clock_for_test(std::chrono::milliseconds by);
bool settling();

}  // namespace uvm
