// Giving a removed backup file's blocks back off the caller's path. Removing a file frees its
// blocks there and then, unless a descriptor still holds it open; on a file system mounted with
// `discard` that took most of a disk resume's time (docs/measurements.md, "Disk resume: which reads
// this disk wants"). So a backup file's name goes at once, and
// a descriptor kept open holds its blocks until a thread of uvm's own closes it. Whoever needs the
// space (a disk offload that finds the disk full) waits for that thread first.
#pragma once

namespace uvm {

// Takes `fd`, a descriptor of a file whose name is already gone, and closes it on uvm's closing
// thread; closes it here instead when many wait already (64, or a sixteenth of the process's
// descriptor limit if that is less) or no thread can be started. Never throws.
void close_in_background(int fd) noexcept;

// Returns once every descriptor handed to close_in_background is closed: their blocks are free.
void wait_for_closed_files();

// For tests: while held, the closing thread closes nothing (what waits for it waits on); and
// returning once a caller waits in wait_for_closed_files.
void hold_closing_for_test(bool held);
void wait_for_a_caller_waiting_for_test();

}  // namespace uvm
