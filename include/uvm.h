/* uvm.h — CUDA unified-memory (managed memory) allocator with a plain C ABI.
 *
 * The whole library on one page, in the order of its folders:
 *   status and errors · allocation and tags (alloc/) · blocks · registry queries · limits · stats ·
 *   capabilities · hints (hints/): prefetch, ranges, advise, discard · offload and onload ·
 *   residency queries · move reports and tracing.
 *
 * Conventions
 * - Every entry is thread-safe and never lets a C++ exception escape. Calls that move memory
 *   (prefetch, offload, onload, discard, uvm_free forgetting an allocation, and the block calls
 *   changing what is kept of one) take turns on the host, and a move of an allocation waits on its
 *   stream for the previous move of that allocation, whatever stream that ran on: two threads
 *   moving the same bytes serialize. Pinning and unpinning staging memory hold no lock the moves
 *   need.
 * - No call changes a byte it was not given: ranges merge only when they overlap or touch, never
 *   across a gap, however small (any byte in a gap may belong to a live tensor).
 * - Functions returning `uvm_status` return UVM_OK (0) on success. On failure they record a message
 *   naming the call, pointer, size, device and CUDA error name, readable with uvm_last_error() on the
 *   same thread, and leave no CUDA error pending (cudaGetLastError() is cleared).
 * - `device` is a CUDA device ordinal, or one of the sentinels below where an entry says so.
 * - Hints run in the caller's current CUDA context on the given stream; if the calling thread has no
 *   current context, the target device's primary context is used (none is ever created elsewhere).
 */
#ifndef UVM_H
#define UVM_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h> /* cudaStream_t */

#if defined(_WIN32)
#define UVM_API __declspec(dllexport)
#else
#define UVM_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define UVM_VERSION_MAJOR 0
#define UVM_VERSION_MINOR 1
#define UVM_VERSION_PATCH 0

/* Devices and locations: the sentinels an int device argument may take, all in one place. Which
 * of them an argument accepts is in its entry's doc; error messages print them by name.
 *   a location (prefetch, advise, uvm_query_location):  an ordinal, or
 *     UVM_LOCATION_CPU  (-1)  host memory (cudaCpuDeviceId)                       printed "cpu"
 *     UVM_LOCATION_NONE (-2)  reported only: unset, or mixed over the range       printed "none"
 *   a selection (uvm_allocation_ranges, uvm_list_allocations, uvm_get_residency, uvm_offload_selection…): an ordinal, or
 *     UVM_ANY_DEVICE    (-1)  every device                                        printed "any"
 *   anything else (allocation, limits, spare limits, stats, capabilities, uvm_mem_get_info): an ordinal only. */
#define UVM_LOCATION_CPU (-1)
#define UVM_LOCATION_NONE (-2)
#define UVM_ANY_DEVICE (-1)

/* ------------------------------------------------------------------------------------------------
 * Status and errors
 * ---------------------------------------------------------------------------------------------- */

/* Result of every fallible call. Values are stable ABI. */
typedef enum uvm_status {
  UVM_OK = 0,
  UVM_ERROR_INVALID_ARGUMENT = 1, /* a null pointer, bad device ordinal, range past its allocation… */
  UVM_ERROR_NOT_MANAGED = 2,      /* the pointer is not CUDA managed memory */
  UVM_ERROR_UNSUPPORTED = 3,      /* the device, driver or runtime lacks the feature */
  UVM_ERROR_LIMIT_EXCEEDED = 4,   /* the allocation would pass the device's managed-memory limit */
  UVM_ERROR_CAPTURING = 5,        /* the stream is being captured into a CUDA graph */
  UVM_ERROR_CUDA = 6,             /* a CUDA runtime call failed; the message names it */
  UVM_ERROR_OUT_OF_MEMORY = 7,    /* cudaMallocManaged could not allocate */
  UVM_ERROR_NO_DEVICE = 8,        /* no CUDA device or driver is available */
  UVM_ERROR_INTERNAL = 9,         /* a bug or host out-of-memory inside uvm */
  UVM_ERROR_IO = 10,              /* a file or host mapping of a disk or mmap copy failed; the message
                                     names the path (or size) and the errno */
  UVM_ERROR_SHARED = 11           /* another process maps the allocation (uvm_share_import): a move that
                                     would take its bytes or memory waits until it closes it */
} uvm_status;

/* The status's name, e.g. "UVM_ERROR_NOT_MANAGED"; "UVM_ERROR_UNKNOWN" for other values. */
UVM_API const char* uvm_status_string(int status);

/* Message of the most recent failed uvm call on this thread, "" if none failed yet. Successful calls
 * leave it as it was (errno-style). Valid until the next uvm call on this thread. */
UVM_API const char* uvm_last_error(void);

/* Status of the most recent failed uvm call on this thread, UVM_OK if none failed yet. */
UVM_API uvm_status uvm_last_status(void);

/* For the most recent failed uvm call on this thread: the index, in the array the caller passed, of
 * the range that made a batched call (uvm_*_ranges) fail; -1 if that failure was not tied to one
 * range (or none failed). Error messages of batched calls give the number of ranges as count=N. */
UVM_API int64_t uvm_last_error_index(void);

/* For the most recent failed uvm call on this thread: the error code the CUDA call that failed
 * returned (a cudaError_t; a CUresult where it was a driver call, whose numbers match the runtime's
 * for the errors both have), so that a caller can hand it on (libuvm_preload.so returns it from
 * cudaMalloc and cudaFree). 0 when that failure was uvm's own, not a CUDA call's, or none failed. */
UVM_API int uvm_last_cuda_error(void);

/* Forget this thread's last error, status, range index and CUDA error. */
UVM_API void uvm_clear_last_error(void);

/* Library version, "MAJOR.MINOR.PATCH". */
UVM_API const char* uvm_version(void);

/* ------------------------------------------------------------------------------------------------
 * Options — the environment variables libuvm reads, all under one policy
 *
 *   UVM_LIMIT_BYTES       the default limit per device in bytes (64G, 512MiB, 1048576)
 *   UVM_LIMIT_FRACTION    the default limit as a fraction of the device's memory (not with the above)
 *   UVM_DEFAULT_ADVICE    device | host | none: the advice new memory gets
 *   UVM_SLABS             1 | 0: 2 MiB segments from shared slabs
 *   UVM_PINNED            register | hostalloc | pageable: how staging memory is pinned
 *   UVM_PIN_NUMA          1 | 0: on a host with several NUMA nodes, staging memory on its GPU's node
 *   UVM_ONLOAD_COPY       auto | engine | sm | mixed: what copies staged bytes into releasable memory
 *   UVM_ONLOAD_CHUNK_MIB  1–4096 (64): MiB an onload moves in one step
 *   UVM_ONLOAD_STREAMS    1–8 (4): streams an onload copies on
 *   UVM_TRACE             a file for every move's phases as Chrome trace events
 *   UVM_DISK_BACKUP_DIR   a directory on a real disk for UVM_STRATEGY_DISK's files
 *   UVM_BACKUP_THREADS    auto | 1–16 (auto: 8 disk writes, 4 disk reads, mmap one per CPU, 8–16):
 *                         threads that move mmap and disk copies
 *   UVM_SETTLE            1 | 0: after a wake made new releasable memory, a thread of uvm's makes and
 *                         gives back 2 MiB now and then for a while, paying the driver's deferred work
 *                         after a large free there instead of in the next sleep's first release
 *   UVM_SHARE_TIMEOUT_S   1–86400 (120): seconds an import or close waits for the exporting process
 *
 * Read once, at the first call that needs one. Unset or empty means the default; names are
 * case-insensitive. A value uvm does not understand is never passed over for the default: uvm_malloc,
 * uvm_malloc_releasable, uvm_get_limit, uvm_get_stats, uvm_get_staging_info, uvm_reserve_staging and
 * every prefetch, discard, offload and onload then fail with UVM_ERROR_INVALID_ARGUMENT, the message
 * naming the variable and its value.
 * ---------------------------------------------------------------------------------------------- */

/* One option, as uvm read it. The strings live as long as the process. */
typedef struct uvm_option_info {
  const char* name;          /* "UVM_PINNED" */
  const char* value;         /* as set in the environment; NULL when unset or empty */
  const char* default_value; /* what unset means */
  const char* meaning;       /* the values it takes and what they do, one line */
} uvm_option_info;

/* How many options there are (the rows of the table above). */
UVM_API int uvm_option_count(void);

/* Fills `info` (not NULL) with option `index`, 0 <= index < uvm_option_count(). */
UVM_API uvm_status uvm_get_option(int index, uvm_option_info* info);

/* UVM_OK when every option set is understood; else UVM_ERROR_INVALID_ARGUMENT naming the first that
 * is not (the calls above fail with the same message). */
UVM_API uvm_status uvm_check_options(void);

/* ------------------------------------------------------------------------------------------------
 * Allocation — the exact signatures torch.cuda.memory.CUDAPluggableAllocator calls
 * ---------------------------------------------------------------------------------------------- */

/* Allocates `size` bytes of managed memory (cudaMallocManaged, cudaMemAttachGlobal) for `device`,
 * applies the default advice, and registers it. The caller's current device and context are
 * restored; no context is created on any other device. `stream` is unused (managed allocation is
 * not stream-ordered). Returns NULL on failure (reason in uvm_last_error()). size 0 returns NULL
 * and is not an error: nothing is allocated, and uvm_free(NULL, …) accepts it back.
 * Exactly 2 MiB (PyTorch's small-tensor segment) comes from a slab: one cudaMallocManaged of 32
 * such segments, so that moving thousands of small tensors costs the driver a few ranges, not one a
 * segment. Each segment is still its own allocation to every uvm call; uvm_free waits for the device
 * as cudaFree does, and the slab goes back to the driver once none of its segments is in use. Env
 * UVM_SLABS=0 turns this off. */
UVM_API void* uvm_malloc(size_t size, int device, cudaStream_t stream);

/* Allocates `size` bytes of releasable device memory for `device`: an address range reserved and
 * mapped with CUDA virtual memory management (cuMemAddressReserve, cuMemCreate, cuMemMap), same
 * signature as uvm_malloc so it can back its own PyTorch pool. It is not managed memory: prefetch
 * and advise refuse it, and a kernel touching it while released faults (an illegal address), as
 * with torch_memory_saver. What it gives instead: once offload or discard has moved *every* byte of
 * an allocation off the device, uvm waits for the call's stream and gives the physical memory back
 * to the driver, so cudaMemGetInfo counts it free at once and the next allocation gets it without
 * waiting for the driver to reclaim pages (managed pages come back only when someone allocates;
 * docs/faq.md has the figures). Onload maps new physical memory at the same
 * addresses and copies the staged bytes back; bytes that were discarded come back undefined. The
 * physical memory is rounded up to the driver's granularity (2 MiB). Same limit, tags, stats and
 * registry as uvm_malloc; uvm_free frees both (it first waits for the device, like cudaFree).
 * Needs no CUDA 13 feature: offload of releasable memory is always staged. */
UVM_API void* uvm_malloc_releasable(size_t size, int device, cudaStream_t stream);

/* Frees memory from uvm_malloc or uvm_malloc_releasable (cudaFree, which waits for kernels still running). NULL is a no-op.
 * An unknown pointer is never passed to CUDA: the error is recorded and it returns. `size`, `device`
 * and `stream` are those of the allocation; a mismatch is recorded as an error but the memory is
 * freed. cudaErrorCudartUnloading at process exit is tolerated. */
UVM_API void uvm_free(void* ptr, size_t size, int device, cudaStream_t stream);

/* Advice uvm_malloc applies to each new allocation for `device`. */
typedef enum uvm_advice_mode {
  UVM_ADVICE_DEVICE = 0, /* preferred location = device, accessed by device (the default) */
  UVM_ADVICE_HOST = 1,   /* preferred location = CPU, accessed by device */
  UVM_ADVICE_NONE = 2    /* no advice: the driver's first-touch placement */
} uvm_advice_mode;

/* Sets the advice for allocations made after this call. Until it is called, the mode comes from env
 * UVM_DEFAULT_ADVICE=device|host|none (default device); a malformed value makes uvm_malloc fail. */
UVM_API uvm_status uvm_set_default_advice(uvm_advice_mode mode);

/* The advice new allocations get now. */
UVM_API uvm_advice_mode uvm_get_default_advice(void);

/* Longest tag, in bytes, and how many distinct tags a process may use. */
#define UVM_TAG_MAX_LENGTH 63
#define UVM_MAX_TAGS 256

/* Sets the tag uvm_malloc stores with every allocation this thread makes from now on ("weights",
 * "kv_cache"), so a caller can later find, offload or discard all of them (uvm_allocation_ranges).
 * NULL or "" means untagged. UVM_ERROR_INVALID_ARGUMENT for a tag longer than UVM_TAG_MAX_LENGTH or
 * past UVM_MAX_TAGS distinct tags. PyTorch's caching allocator calls uvm_malloc on the allocating
 * thread, so the tag applies to the tensors a thread creates — but it reuses cached blocks within a
 * pool, so give each tag its own pool. */
UVM_API uvm_status uvm_set_thread_tag(const char* tag);

/* This thread's tag, "" when untagged. Valid for the life of the process. */
UVM_API const char* uvm_get_thread_tag(void);

/* What uvm_pause keeps of an allocation: recorded with it when it is made, from the setting of the
 * thread that makes it (as the tag is). */
typedef enum uvm_backup {
  UVM_BACKUP_NONE = 0, /* nothing: paused, its bytes are dropped and come back undefined (the default) */
  UVM_BACKUP_HOST = 1, /* a copy in uvm's pinned staging memory, copied back on resume */
  UVM_BACKUP_MMAP = 2, /* a copy in pageable host memory mapped for it, given back once resumed
                          (as UVM_STRATEGY_MMAP): for hosts that cannot keep pinned copies */
  UVM_BACKUP_DISK = 3  /* a copy in a file of the disk backup directory, removed once resumed (as
                          UVM_STRATEGY_DISK): for copies that outgrow host memory */
} uvm_backup;

/* Sets the backup uvm_malloc records with every allocation this thread makes from now on. */
UVM_API uvm_status uvm_set_thread_backup(uvm_backup backup);

/* This thread's backup setting. */
UVM_API uvm_backup uvm_get_thread_backup(void);

/* With `compress` 1, uvm_pause compresses the backups (host, mmap or disk) of the allocations this
 * thread makes from now on; 0 (the default) keeps them as they are. Recorded with each allocation, as
 * the backup is. uvm's own kernels code each 64 KiB chunk on the GPU before its copy out and decode it
 * after its copy in: bf16 weights take about 0.72 of their bytes on the link and in host memory,
 * and a chunk that does not compress (fp16, fp32, int8, fp8, random bytes) is kept as it is. Lossless
 * for every bit pattern. Where the kernels cannot load, the pause keeps plain copies and says why once
 * on stderr. A compressed copy is not readable in place (uvm_get_staged_copy gives NULL).
 * UVM_ERROR_INVALID_ARGUMENT unless 0 or 1. */
UVM_API uvm_status uvm_set_thread_compression(int compress);

/* This thread's compression setting: 1 or 0. */
UVM_API int uvm_get_thread_compression(void);

/* ------------------------------------------------------------------------------------------------
 * Blocks — for runtimes that cut their own blocks out of uvm allocations and reuse them without
 * uvm_free. PyTorch's caching allocator does: it hands a freed tensor's block to the next tensor
 * inside a live segment. The Python shim reports PyTorch's blocks itself; call these from any other
 * runtime that sub-allocates, or staged bytes may outlive the block they were staged for.
 * ---------------------------------------------------------------------------------------------- */

/* With `enabled` 1, declares that from now on the runtime reports every block it cuts out of a uvm
 * allocation (call it once, before it allocates; 0 stops it for allocations made later). In an
 * allocation made while it is on that has had a block reported, bytes outside the live blocks are
 * free space: an offload drops them (discarded, no copy) instead of staging them, and an onload
 * leaves them alone. Allocations made while it is off, and ones no block is ever reported for (a
 * plain buffer), keep every byte. */
UVM_API uvm_status uvm_report_blocks(int enabled);

/* The runtime handed out [ptr, ptr + size) as a new block. What uvm kept for the bytes' earlier
 * owner is dropped: a staged host copy of them is never copied back, and they count as on the
 * device (the new owner writes them). A move of their allocation still running is waited for, and
 * a releasable allocation whose physical memory was given back is mapped again before this
 * returns, so that the new owner's kernels find memory, never a fault (on failure, e.g.
 * UVM_ERROR_OUT_OF_MEMORY, the block has none: do not hand it out). UVM_OK and nothing done for
 * memory uvm did not allocate, or size 0; UVM_ERROR_INVALID_ARGUMENT for a block that runs past
 * the end of its allocation. */
UVM_API uvm_status uvm_block_allocated(const void* ptr, size_t size);

/* The runtime took [ptr, ptr + size) back. A staged host copy of its bytes is dropped, never to be
 * copied anywhere, and its pinned memory is reused once nothing else in its staging block is
 * staged; those bytes then count as discarded. No CUDA call: UVM_OK for memory uvm did not
 * allocate, or size 0; UVM_ERROR_INVALID_ARGUMENT for a block that runs past its allocation. */
UVM_API uvm_status uvm_block_freed(const void* ptr, size_t size);

/* ------------------------------------------------------------------------------------------------
 * Registry queries
 * ---------------------------------------------------------------------------------------------- */

/* A byte range, for the batched calls. */
typedef struct uvm_range {
  const void* ptr;
  size_t size;
} uvm_range;

/* 1 if `ptr` points into CUDA managed memory (a uvm_malloc allocation or any other), else 0 (also
 * for releasable allocations, which are device memory). */
UVM_API int uvm_is_managed(const void* ptr);

/* Base, size and device of the live uvm allocation that contains `ptr`. UVM_ERROR_NOT_MANAGED if
 * no uvm allocation contains it. Any out-pointer may be NULL. */
UVM_API uvm_status uvm_allocation_info(const void* ptr, void** base, size_t* size, int* device);

/* The live uvm allocations of `device` (or UVM_ANY_DEVICE) whose tag is `tag` (NULL: any tag; "":
 * untagged), by address. Writes at most `capacity` of them to `out` (which may be NULL when
 * capacity is 0) and sets `*count` to how many there are, so a first call with capacity 0 sizes the
 * array. To move them, uvm_offload_selection and its siblings select and move in one step. */
UVM_API uvm_status uvm_allocation_ranges(int device, const char* tag, uvm_range* out, size_t capacity,
                                         size_t* count);

/* A live uvm allocation as uvm_list_allocations reports it. */
typedef struct uvm_allocation {
  const void* ptr; /* its base */
  size_t size;
  int device;      /* the device it was allocated for: the one its moves run on */
  int releasable;  /* 1 for uvm_malloc_releasable memory, 0 for managed memory */
} uvm_allocation;

/* The same selection as uvm_allocation_ranges, each allocation with its device and backing, so a
 * caller can group them by device (offload and onload take one device's ranges per call) without
 * asking uvm_allocation_info for each. */
UVM_API uvm_status uvm_list_allocations(int device, const char* tag, uvm_allocation* out, size_t capacity,
                                        size_t* count);

/* ------------------------------------------------------------------------------------------------
 * Limits — a per-device cap on live managed bytes allocated through uvm
 * ---------------------------------------------------------------------------------------------- */

/* Pass to uvm_set_limit to allow any size (oversubscription is then the caller's choice). */
#define UVM_LIMIT_UNLIMITED ((size_t)-1)

/* Sets the cap on live bytes for `device`; 0 restores the default. The default is the device's total
 * memory, or env UVM_LIMIT_BYTES (bytes) or UVM_LIMIT_FRACTION (of total memory; >1 oversubscribes).
 * A cap below the live bytes is allowed: later allocations fail until enough is freed. */
UVM_API uvm_status uvm_set_limit(int device, size_t bytes);

/* The cap in force for `device`. */
UVM_API uvm_status uvm_get_limit(int device, size_t* bytes);

/* ------------------------------------------------------------------------------------------------
 * Stats — counters per device, for allocations made through uvm
 * ---------------------------------------------------------------------------------------------- */

typedef struct uvm_stats {
  size_t live_bytes;            /* bytes allocated and not yet freed */
  size_t peak_bytes;            /* highest live_bytes since start or uvm_reset_peak */
  size_t live_allocations;      /* allocations not yet freed */
  uint64_t total_allocations;   /* successful uvm_malloc calls (size > 0) */
  uint64_t total_frees;         /* successful uvm_free calls (ptr != NULL) */
  size_t limit_bytes;           /* the cap in force (see Limits) */
  size_t host_resident_bytes;   /* live bytes whose last move by uvm was to the CPU */
  uint64_t bytes_to_device;     /* bytes uvm prefetched to a GPU, in total */
  uint64_t bytes_to_host;       /* bytes uvm prefetched to the CPU, in total */
  uint64_t bytes_discarded;     /* bytes uvm discarded, in total */
  uint64_t prefetch_calls;      /* cudaMemPrefetchAsync calls uvm issued, in total */
  size_t spare_bytes;           /* physical memory kept for releasable allocations to map again
                                   (uvm_set_spare_limit); cudaMemGetInfo counts it used */
} uvm_stats;

/* Fills `stats` for `device`. Touches no CUDA context. */
UVM_API uvm_status uvm_get_stats(int device, uvm_stats* stats);

/* Sets peak_bytes of `device` to its current live_bytes. */
UVM_API uvm_status uvm_reset_peak(int device);

/* ------------------------------------------------------------------------------------------------
 * Capabilities — probed once per device, then cached
 * ---------------------------------------------------------------------------------------------- */

typedef struct uvm_device_caps {
  int managed_memory;            /* cudaDevAttrManagedMemory */
  int concurrent_managed_access; /* cudaDevAttrConcurrentManagedAccess: needed by prefetch, advise */
  int pageable_memory_access;    /* cudaDevAttrPageableMemoryAccess (HMM or ATS) */
  int discard_supported;         /* uvm_discard can work: CUDA 13 runtime and driver, concurrent access */
  size_t total_memory;           /* bytes of device memory */
} uvm_device_caps;

/* Number of CUDA devices; 0 (and UVM_ERROR_NO_DEVICE recorded) when there is no device or driver. */
UVM_API int uvm_device_count(void);

/* Fills `caps` for `device` without creating a context. The answer is kept once had; a query that
 * fails is this call's error (naming it), and the next call asks again. */
UVM_API uvm_status uvm_device_capabilities(int device, uvm_device_caps* caps);

/* Waits for all work on `device` (cudaDeviceSynchronize in its primary context; the caller's context
 * is restored). For callers that must not wait inside their framework's own bindings: a Python
 * thread waiting through ctypes may be ended at interpreter exit without aborting the process. */
UVM_API uvm_status uvm_device_synchronize(int device);

/* ------------------------------------------------------------------------------------------------
 * Hints — prefetch, advise, discard
 * ---------------------------------------------------------------------------------------------- */

/* Migrates [ptr, ptr+size) to `device` (UVM_LOCATION_CPU for host), asynchronously on `stream`
 * (cudaMemPrefetchAsync). size 0 is a no-op. UVM_ERROR_NOT_MANAGED for other memory,
 * UVM_ERROR_UNSUPPORTED without concurrentManagedAccess, UVM_ERROR_CAPTURING while `stream` is
 * being captured (prefetch cannot be captured; the capture is left intact). */
UVM_API uvm_status uvm_prefetch(const void* ptr, size_t size, int device, cudaStream_t stream);

/* Prefetches all `ranges` to `device` with the fewest, largest driver calls: ranges are sorted, and
 * ranges inside one allocation that overlap or touch are merged (PyTorch packs tensors whose sizes
 * are multiples of 512 end to end); a gap is never merged. Every range is validated before any call
 * is issued. Empty ranges are skipped. */
UVM_API uvm_status uvm_prefetch_ranges(const uvm_range* ranges, size_t count, int device,
                                       cudaStream_t stream);

/* cudaMemAdviseSetPreferredLocation: pages of the range prefer to live on `device` (or the CPU). */
UVM_API uvm_status uvm_advise_preferred_location(const void* ptr, size_t size, int device);

/* cudaMemAdviseSetAccessedBy: `device` keeps a mapping to the range wherever its pages live. */
UVM_API uvm_status uvm_advise_accessed_by(const void* ptr, size_t size, int device);

/* Tells the driver the range's contents are no longer needed (cudaMemDiscardBatchAsync), so its
 * pages can be reclaimed without being copied; reading them before a write or prefetch gives
 * indeterminate values. Needs a CUDA 13 runtime and driver, else UVM_ERROR_UNSUPPORTED. The legacy
 * NULL stream is accepted (the driver rejects it: uvm orders the discard through a blocking stream
 * of its own, which synchronizes with the legacy stream both ways). */
UVM_API uvm_status uvm_discard(const void* ptr, size_t size, cudaStream_t stream);

/* Discards every range (see uvm_discard) in one driver call, after merging them like
 * uvm_prefetch_ranges: exactly the bytes named. Host copies uvm staged for these bytes are dropped
 * too. */
UVM_API uvm_status uvm_discard_ranges(const uvm_range* ranges, size_t count, cudaStream_t stream);

/* ------------------------------------------------------------------------------------------------
 * Offload and onload — move memory off a GPU so others can use it, and bring it back
 * ---------------------------------------------------------------------------------------------- */

/* How uvm_offload_ranges moves bytes to the host. */
typedef enum uvm_strategy {
  UVM_STRATEGY_AUTO = 0,    /* the measured best: STAGED where discard is supported, else MIGRATE */
  UVM_STRATEGY_MIGRATE = 1, /* cudaMemPrefetchAsync to the CPU; holds no extra host memory */
  UVM_STRATEGY_STAGED = 2,  /* copy into uvm's pinned staging memory, then discard (CUDA 13); for
                               uvm's own allocations only (AUTO migrates other managed memory) */
  UVM_STRATEGY_MMAP = 3,    /* copy into pageable host memory mapped for these bytes alone (one
                               mapping per allocation), then discard; given back when they are
                               onloaded, discarded or freed. uvm's allocations only */
  UVM_STRATEGY_DISK = 4     /* copy into files of the disk backup directory (one per allocation,
                               owner-only), then discard; removed when the bytes are onloaded,
                               discarded or freed. uvm's allocations only */
} uvm_strategy;

/* Moves `ranges` off their GPUs, asynchronously on `stream`; once the stream reaches that point the
 * device memory is reclaimable by any allocation (cudaMemGetInfo does not show it as free: see
 * uvm_get_residency). Pointers never change. Ranges are validated first, then sorted and merged
 * where they overlap or touch inside one allocation (never across a gap: bytes between ranges stay
 * where they are, untouched); one call never spans two allocations (the driver rejects that).
 * Bytes already offloaded are skipped, and so is a releasable allocation already given back. STAGED
 * keeps the host copy in pinned memory that uvm reuses across cycles (uvm_release_staging gives it
 * back); the copy dies with its allocation, or with its block (see Blocks). In an allocation whose
 * blocks are reported (uvm_report_blocks), free space is discarded, not copied. Staging it
 * must add first is pinned in steps while the copies into the steps done run (uvm_reserve_staging).
 * After an offload that staged bytes, staging blocks left holding nothing (the set offloaded shrank)
 * are freed on a thread of uvm's, so that the host memory held stays near what is offloaded.
 * Touching offloaded bytes before uvm_onload_ranges gives indeterminate values for STAGED ones.
 * UVM_ERROR_UNSUPPORTED for STAGED without discard support; UVM_ERROR_INVALID_ARGUMENT for STAGED
 * on managed memory uvm did not allocate (uvm could not see it freed); UVM_ERROR_CAPTURING while
 * `stream` is captured. */
UVM_API uvm_status uvm_offload_ranges(const uvm_range* ranges, size_t count, uvm_strategy strategy,
                                      cudaStream_t stream);

/* MMAP and DISK copies go through pinned bounce buffers uvm keeps (env UVM_BACKUP_THREADS threads,
 * each with its own buffer (16 MiB; 64 MiB reading a disk) and stream; files are written with
 * O_DIRECT where the file system takes it). Unlike STAGED they are synchronous: the call waits for `stream`, copies, and returns
 * once the bytes are in host memory or on disk (the discard that follows is on `stream`). If a copy
 * fails (the disk is full, the directory was removed) nothing is discarded: the bytes stay on the
 * device, and no mapping or file is left behind; UVM_ERROR_IO names the path and the errno. */

/* Brings `ranges` back to the device of the allocation holding them, asynchronously on `stream`:
 * staged bytes are copied back from pinned memory (populating and copying in pieces over uvm's own
 * streams, joined to `stream` before and after), the rest is prefetched. Merged like offload.
 * Into releasable memory env UVM_ONLOAD_COPY=auto (the default) copies with a uvm kernel reading the
 * pinned memory when the device has more than 4 times the staged bytes free (after a bulk free the
 * copy engine runs at half speed; the kernel does not), else with cudaMemcpyAsync; sm and engine
 * fix the choice, mixed uses both ("Options"). Bytes kept in mmap'ed memory or on disk come back
 * synchronously through the bounce buffers (the call waits for `stream` first); a file changed,
 * truncated or removed while its bytes were offloaded fails with UVM_ERROR_IO naming it, and those
 * bytes stay offloaded. */
UVM_API uvm_status uvm_onload_ranges(const uvm_range* ranges, size_t count, cudaStream_t stream);

/* Whole allocations by device and tags: the live allocations of `device` (or UVM_ANY_DEVICE) with
 * any of the `tag_count` tags at `tags` ("" for untagged; tags NULL and tag_count 0: any tag), moved
 * as uvm_offload_ranges, uvm_onload_ranges and uvm_discard_ranges move their ranges, each device's
 * in one move of its own (in its context, recorded for uvm_last_move of that device). They are
 * chosen where the move begins, under the lock uvm_free takes: an allocation another thread frees
 * or makes meanwhile is moved whole or not at all, and bytes at an address freed and given to
 * another allocation are never moved for the old one (listing them with uvm_allocation_ranges
 * first leaves that window open). A tag never set selects nothing. `stream`: a stream of
 * `device`; with UVM_ANY_DEVICE only a handle naming each device's own stream (NULL,
 * cudaStreamLegacy, cudaStreamPerThread), else UVM_ERROR_INVALID_ARGUMENT. `bytes` (may be NULL):
 * the bytes of the allocations moved. Nothing selected is not an error: nothing is done, and no
 * device is touched. A failure on one device stops the call there (earlier devices stay moved). */
UVM_API uvm_status uvm_offload_selection(int device, const char* const* tags, size_t tag_count, uvm_strategy strategy,
                                         cudaStream_t stream, size_t* bytes);
UVM_API uvm_status uvm_onload_selection(int device, const char* const* tags, size_t tag_count, cudaStream_t stream,
                                        size_t* bytes);
UVM_API uvm_status uvm_discard_selection(int device, const char* const* tags, size_t tag_count, cudaStream_t stream,
                                         size_t* bytes);

/* Several move calls as one: a caller that finds its ranges while the copies of those it already
 * gave run (the Python shim gives a module's tensors in slices, so that their copies start at
 * once) opens a group on its thread, makes its calls, and ends it. In between, the calling thread's
 * move calls (offload, onload, discard, prefetch; ranges or selections) on one device are one move
 * for uvm_last_move and UVM_TRACE (named after the first call, with the first failure's status),
 * and the staging blocks an offload leaves holding nothing are freed once, at the end, not after
 * each call (the next call would pin them again). `staging_bytes`: what the group's offloads are
 * expected to stage, or 0 if unknown; an offload of the group that must pin staging pins the rest
 * of that too, in steps that the later calls fill as they are pinned (a first offload then copies
 * while it pins, as one call would); steps left unused go back at the end. Each call still
 * validates and moves its own ranges and returns its own status, as it would alone: when one
 * fails, what the calls before it moved stays moved. Groups nest (their staging_bytes add up);
 * only the outermost end acts. Ending a group that is not open: UVM_ERROR_INVALID_ARGUMENT. A
 * group left open when its thread ends is never published. */
UVM_API uvm_status uvm_begin_moves(size_t staging_bytes);
UVM_API uvm_status uvm_end_moves(void);

/* ------------------------------------------------------------------------------------------------
 * Streaming — bytes that live on the host and visit the GPU (weights of a model larger than it)
 * ---------------------------------------------------------------------------------------------- */

/* uvm_onload_ranges that keeps the host copies: pinned and mmap'ed copies stay with their bytes as
 * clean copies (counted in uvm_kept_copies' retained_bytes), so that uvm_drop_clean_ranges can let
 * the device bytes go again without copying them out. Disk copies are read and removed as by an
 * onload. Asynchronous on `stream` like uvm_onload_ranges; when `arrived` (an event of the stream's
 * device, or NULL) is given it is recorded on `stream` once the bytes are issued, so that another
 * stream can wait for exactly them (cudaStreamWaitEvent). Under UVM_ONLOAD_COPY=auto its copies run
 * on the copy engine: a fetch runs beside kernels, from which uvm's copy kernel would take SMs.
 * They run on one of uvm's streams (not UVM_ONLOAD_STREAMS), in chunks of UVM_ONLOAD_CHUNK_MIB but
 * at least 256 MiB: fetches are queued ahead of use, and more streams only interleave them. */
UVM_API uvm_status uvm_fetch_ranges(const uvm_range* ranges, size_t count, cudaStream_t stream,
                                    cudaEvent_t arrived);

/* Lets the device bytes of `ranges` go, asynchronously on `stream` and with no copy: their clean
 * host copy (kept by uvm_fetch_ranges) becomes their offloaded copy again, as after a STAGED or
 * MMAP offload, and a releasable allocation left with no byte on its device gives its physical
 * memory back (the call waits for `stream` first, as an offload does). The caller vouches that
 * nothing wrote the bytes since they were fetched (the next uvm_fetch_ranges brings back the host
 * copy, not what a kernel wrote); bytes that may have changed are offloaded instead, which writes
 * the host copy again in place. Bytes already offloaded and free space are skipped. Every byte
 * must have a clean copy, else UVM_ERROR_INVALID_ARGUMENT names the first one without and nothing
 * is dropped: a copy goes when its bytes are offloaded, discarded or freed, and with its block
 * (uvm_block_freed). Merged and ordered like uvm_offload_ranges. */
UVM_API uvm_status uvm_drop_clean_ranges(const uvm_range* ranges, size_t count, cudaStream_t stream);

/* Lets releasable allocations of `device` keep up to `bytes` of the physical memory that offloads
 * and drops give back, as spare memory: the next allocation of the same size that needs physical
 * memory there (an onload, a fetch, uvm_malloc_releasable) maps it again instead of asking the
 * driver. Streaming gives back one layer's memory and takes the next one's at every step, and
 * giving memory back to the driver while a copy runs slows that copy by 11 % (docs/performance.md).
 * Spare memory is not free for other allocations (uvm_stats' spare_bytes; cudaMemGetInfo counts it
 * used), but uvm gives it back when the device is out of memory for one of its releasable
 * allocations (cuMemCreate fails), then asks again. Default 0:
 * every byte goes back at once. Lowering the limit gives back what is above it now, oldest first;
 * 0 gives back all (uvm.stream sets it while it streams and puts it back after). Touches no CUDA
 * context unless memory is given back. */
UVM_API uvm_status uvm_set_spare_limit(int device, size_t bytes);

/* The spare limit of `device` (see uvm_set_spare_limit). */
UVM_API uvm_status uvm_get_spare_limit(int device, size_t* bytes);

/* Sets the directory UVM_STRATEGY_DISK and UVM_BACKUP_DISK write their files to (default: env
 * UVM_DISK_BACKUP_DIR; none: a disk offload fails saying so). The directory must exist, be
 * writable, belong to this process's user and not be a tmpfs or ramfs (a copy there would hold
 * host memory): else UVM_ERROR_INVALID_ARGUMENT names the path and the reason. Files are named
 * uvm-<pid>-<n>.backup, created mode 0600, and removed when the process exits normally. A process
 * killed with files there leaves them until the next process that uses the directory: it removes
 * the files of processes no longer alive (each holds a lock on uvm-<pid>.lock while it lives).
 * Offloads already on disk keep their files. */
UVM_API uvm_status uvm_set_disk_backup_dir(const char* path);

/* Copies the disk backup directory into `path` (`capacity` bytes, NUL included); "" when none is
 * set. UVM_ERROR_INVALID_ARGUMENT if it does not fit. */
UVM_API uvm_status uvm_get_disk_backup_dir(char* path, size_t capacity);

/* The offloaded copies of a set of allocations, by where they are kept. */
typedef struct uvm_kept_copies {
  size_t pinned_bytes;   /* in uvm's pinned staging memory (uvm_residency's staged_bytes) */
  size_t pageable_bytes; /* in mmap'ed pageable memory (UVM_STRATEGY_MMAP, UVM_BACKUP_MMAP) */
  size_t disk_bytes;     /* in files on disk (UVM_STRATEGY_DISK, UVM_BACKUP_DISK) */
  size_t disk_files;     /* the files holding them */
  size_t retained_bytes; /* copies of bytes back on the device, kept by uvm_resume with
                            uvm_set_retain_backups(1) (pinned, pageable and files; not in the
                            counts above) */
} uvm_kept_copies;

/* Fills `kept` (not NULL) for the allocations of `device` (or UVM_ANY_DEVICE) with tag `tag` (NULL:
 * any; "": untagged). Touches no CUDA context. */
UVM_API uvm_status uvm_get_kept_copies(int device, const char* tag, uvm_kept_copies* kept);

/* The compressed copies (uvm_set_thread_compression) of the same selection, staged and retained:
 * `raw_bytes` the device bytes they hold, `stored_bytes` the host memory or disk they take. Either
 * pointer may be NULL. Touches no CUDA context. */
UVM_API uvm_status uvm_get_compressed_copies(int device, const char* tag, size_t* raw_bytes, size_t* stored_bytes);

/* Pinned host memory uvm holds for staged offload, and how much of it holds offloaded data. Either
 * out-pointer may be NULL. Superseded by uvm_get_staging_info, which says more; kept, as every entry
 * of this header is within a major version (docs/changelog.md). */
UVM_API uvm_status uvm_get_staging(size_t* capacity_bytes, size_t* staged_bytes);

/* How uvm gets its staging memory (env UVM_PINNED; see uvm_reserve_staging). */
typedef enum uvm_pinned_kind {
  UVM_PINNED_REGISTERED = 0, /* mapped, huge pages where allowed, cudaHostRegister (the default) */
  UVM_PINNED_HOST_ALLOC = 1, /* cudaHostAlloc (UVM_PINNED=hostalloc, or where registering failed) */
  UVM_PINNED_PAGEABLE = 2    /* mapped but never pinned (UVM_PINNED=pageable): slower copies */
} uvm_pinned_kind;

/* The staging memory uvm holds, by how it was got. */
typedef struct uvm_staging_info {
  size_t capacity_bytes;     /* host memory held for staging, all kinds together */
  size_t staged_bytes;       /* of it, holding offloaded data */
  size_t registered_bytes;   /* of it, UVM_PINNED_REGISTERED */
  size_t host_alloc_bytes;   /* of it, UVM_PINNED_HOST_ALLOC */
  size_t pageable_bytes;     /* of it, UVM_PINNED_PAGEABLE */
  size_t pinning_bytes;      /* of registered_bytes, not pinned yet: a block still being pinned in steps */
  size_t blocks;             /* host allocations held */
  int configured_kind;       /* the uvm_pinned_kind env UVM_PINNED asks for */
} uvm_staging_info;

/* Fills `info` (not NULL) with the staging memory held, by kind. */
UVM_API uvm_status uvm_get_staging_info(uvm_staging_info* info);

/* Allocates pinned staging memory ahead of need, so that a later staged offload of up to `bytes` in
 * one call pays no pinning on its critical path: call it at model load. (Without it, an offload
 * that needs more staging pins a new block in 256 MiB steps on a thread of its own and copies into
 * each step as soon as it is pinned, at a fraction of the steady speed: docs/performance.md.)
 * Allocates only if no staging block has `bytes` free; 0 does nothing. Holds no lock the moves need
 * (an offload on another thread that needs memory meanwhile waits for this block and uses it).
 * Staging memory is mapped, backed by transparent huge pages where the host allows, faulted in by
 * several threads and registered (cudaHostRegisterPortable, several times faster than
 * cudaHostAlloc); cudaHostAllocPortable if that fails, or with env UVM_PINNED=hostalloc. It is
 * pinned for every device; uvm_release_staging gives it back. Env UVM_PINNED=pageable, for hosts
 * short on pinnable memory, maps and faults it in but never pins it: the driver then stages every
 * copy, several times slower (docs/performance.md). */
UVM_API uvm_status uvm_reserve_staging(size_t bytes);

/* Frees the pinned staging memory that holds no offloaded data, and the bounce buffers of mmap and
 * disk copies not in use (pinned again at the next such move): empty blocks, and the 256 MiB steps
 * of a block pinned in steps past the last one in use (waits for copies still reading it; if that
 * wait fails, the block is kept and the next call tries again). While an offload on another
 * thread is between pinning room for itself and using it, it frees nothing (an offload must not
 * lose the room it made). Takes no lock the moves need. A block that holds nothing and is still
 * being pinned in steps (a uvm_prepare_pause's, or the rest of one an offload pinned) stops after
 * the step in flight, which this waits for (one registration of at most 256 MiB) and gives back
 * with the rest. Returns once a free of empty blocks that an offload started in the background
 * has ended too. */
UVM_API uvm_status uvm_release_staging(void);

/* uvm_release_staging's free of staging memory, started on a thread of uvm's: returns at once
 * (unpinning and unmapping GiBs takes about 0.1 s that a caller need not wait for, e.g. a resume
 * that gives its backups back). Bounce buffers are freed before it returns. A later
 * uvm_release_staging waits for it; an offload meanwhile pins what it needs. */
UVM_API uvm_status uvm_release_staging_async(void);

/* ------------------------------------------------------------------------------------------------
 * Pause and resume — whole tags off the GPU and back, torch_memory_saver's model
 * ---------------------------------------------------------------------------------------------- */

/* Pauses the live allocations of `device` (UVM_ANY_DEVICE: every device) with `tag` (NULL: any tag;
 * "": untagged) that are not paused: for each device, waits for all its work (kernels may still
 * use them), drops those with UVM_BACKUP_NONE (as uvm_discard_ranges) and stages those with
 * UVM_BACKUP_HOST (as uvm_offload_ranges, UVM_STRATEGY_AUTO), UVM_BACKUP_MMAP (UVM_STRATEGY_MMAP)
 * and UVM_BACKUP_DISK (UVM_STRATEGY_DISK), on the device's legacy stream in its
 * own context, waits again, and marks them paused. Releasable memory is given back to the driver.
 * Returns when their memory is free. Pausing what is paused does nothing; an allocation made while
 * its tag is paused is not paused. If a device's moves fail, the call fails naming what failed:
 * devices done before stay paused, and on that device what was dropped is paused while what was to
 * be kept stays on the device (an offload that fails keeps its bytes there). Pause and resume take
 * turns with each other. */
UVM_API uvm_status uvm_pause(int device, const char* tag);

/* Brings back what uvm_pause paused in the selection: for each device, in its own context, one
 * onload of all of them (releasable memory mapped again, kept bytes copied back), a wait for it,
 * and the paused mark cleared. Returns when their bytes are back; mmap'ed copies and files are
 * given back then. A failure (UVM_ERROR_OUT_OF_MEMORY when the device has no memory to map them
 * again) leaves that device's allocations paused with their copies, to resume again. */
UVM_API uvm_status uvm_resume(int device, const char* tag);

/* With `retain` 1, uvm_resume keeps the copies it brings back (UVM_BACKUP_HOST, UVM_BACKUP_MMAP and
 * UVM_BACKUP_DISK) instead of giving them back: each stays with its allocation as a retained copy —
 * what the bytes were when paused, never copied back — readable at the same address through
 * uvm_get_staged_copy when in host memory, and, for a pinned one or a file, written again in place
 * by the next pause (the file and its blocks stay; an mmap'ed one is replaced). A retained copy goes when its bytes are staged again or
 * discarded, when a block is handed out or taken back over them, when its allocation is freed, and
 * at a resume with `retain` 0. Process-wide; read by each uvm_resume; default 0.
 * UVM_ERROR_INVALID_ARGUMENT for anything but 0 or 1. */
UVM_API uvm_status uvm_set_retain_backups(int retain);

/* uvm_set_retain_backups's setting: 1 or 0. */
UVM_API int uvm_get_retain_backups(void);

/* How many live allocations of the selection are paused. */
UVM_API uvm_status uvm_paused_count(int device, const char* tag, size_t* count);

/* Sets what the next uvm_pause keeps of the live allocations of the selection (device and tag as for
 * uvm_pause) that are not paused: `backup`, compressed when `compress` is 1 (0 or 1; ignored for
 * UVM_BACKUP_NONE). For runtimes that choose at the pause, not at the allocation, what each tag
 * keeps (vLLM's sleep(offload_tags)). A paused allocation keeps what it was paused with. Takes turns
 * with pause and resume. `*changed` (may be NULL) is how many allocations it set. */
UVM_API uvm_status uvm_set_backup(int device, const char* tag, uvm_backup backup, int compress, size_t* changed);

/* Gives the live allocation holding `ptr` the tag `tag` (NULL or "": untagged), so that selections
 * by tag (pause, resume, the selection moves, residency) find it under its new tag from now on. For
 * a runtime that sets memory aside where its tag's pauses must not reach it (vLLM's trimmed pool
 * segments). UVM_ERROR_INVALID_ARGUMENT for a paused allocation (resume it first) or a bad tag;
 * UVM_ERROR_NOT_MANAGED if no uvm allocation holds `ptr`. Takes turns with pause and resume. */
UVM_API uvm_status uvm_set_allocation_tag(const void* ptr, const char* tag);

/* One live allocation as pause and resume see it (uvm_get_allocation_state). */
typedef struct uvm_allocation_state {
  const void* base;  /* the allocation holding the pointer asked about */
  size_t size;
  int device;
  int paused;        /* 1: paused by uvm_pause and not resumed since */
  int released;      /* 1: releasable memory whose physical memory is given back (paused, or every byte
                        moved off the device) */
  uvm_backup backup; /* what uvm_pause keeps (or kept) of it */
  int compressed;    /* 1: uvm_pause compresses what it keeps */
} uvm_allocation_state;

/* The state of the live allocation holding `ptr`. UVM_ERROR_NOT_MANAGED if no uvm allocation holds
 * it; UVM_ERROR_INVALID_ARGUMENT if `state` is NULL. */
UVM_API uvm_status uvm_get_allocation_state(const void* ptr, uvm_allocation_state* state);

/* Pins, ahead of need, the staging memory the next pause of the selection (device and tag as for
 * uvm_pause) will copy into: for its allocations kept in pinned host memory (UVM_BACKUP_HOST) that
 * are on their device and hold no copy (their bytes the pause will copy: free space left out, a
 * compressed allocation at the size bf16 weights code to), so that a first pause runs as fast as
 * the later ones; and, where the selection has compressed allocations (any backup), loads the
 * coder's kernels first. Call
 * it from a thread of your own while the model loads: it pins in batches of about 256 MiB (an
 * allocation larger than that is one batch), each pinned in 256 MiB steps, and holds no lock a move
 * needs (a pause meanwhile copies into the steps pinned so far and pins the rest itself). What it
 * holds: the bytes the pause will copy, rounded up to a block of at least 256 MiB. Prepares at
 * most `max_bytes` beyond the room already held (0: no bound; a new block is at least 256 MiB, so it
 * may pin up to that), `*pinned` (may be NULL) says how much it added. A
 * uvm_release_staging stops it after the 256 MiB step in flight and gives back what holds nothing,
 * that step too, before it returns (its async form stops it the same way; the next release gives
 * back that step). A pause of any of its
 * allocations that begins meanwhile stops it after the batch in flight, and one under way when it is
 * asked makes it pin nothing (the pause pins what it still needs). Without retained backups
 * (uvm_set_retain_backups) each resume gives the staging back, so only the first pause gains. */
UVM_API uvm_status uvm_prepare_pause(int device, const char* tag, size_t max_bytes, size_t* pinned);

/* ------------------------------------------------------------------------------------------------
 * Sharing with other processes — releasable memory mapped by another process on the same node
 * ---------------------------------------------------------------------------------------------- */

/* What another process needs to map an allocation of this one: plain bytes, to send any way (a pipe,
 * a pickle); it names this process and the allocation, and holds the export's secret token (16
 * random bytes), without which the exporter maps nothing. Whoever holds it can map the memory
 * read-write and, while mapping it, hold off the exporter's pauses: send it only where it is meant. */
#define UVM_SHARE_HANDLE_BYTES 64
typedef struct uvm_share_handle {
  unsigned char bytes[UVM_SHARE_HANDLE_BYTES];
} uvm_share_handle;

/* With `exportable` 1, the releasable allocations this thread makes from now on get memory another
 * process can map (a POSIX file descriptor), at their first map and every later one (each resume and
 * onload); 0 (the default) does not. Recorded with each allocation. NCCL can map such memory into its
 * peers (user-buffer and graph registration), and keeps what it mapped across a pause: lift its
 * registrations first (uvm.nccl), or make exportable only what is sent to other processes.
 * UVM_ERROR_INVALID_ARGUMENT unless 0 or 1. */
UVM_API uvm_status uvm_set_thread_exportable(int exportable);

/* This thread's exportable setting: 1 or 0. */
UVM_API int uvm_get_thread_exportable(void);

/* A handle for the releasable allocation holding `ptr` (uvm_malloc_releasable), pointing at `ptr`.
 * The allocation must have been made exportable (uvm_set_thread_exportable): memory is never swapped
 * for exportable memory under work other threads may launch, which could lose the GPU context. One
 * that was not fails, UVM_ERROR_UNSUPPORTED naming how, and is exportable from its next map (a resume
 * or onload) on. An import of a handle from before a pause or offload fails (the memory is new);
 * export again. The first export starts a thread that answers imports on a Unix socket of this
 * process (Linux's abstract namespace: no file, no privilege; processes of the same user in the same
 * network namespace reach it, and only with the handle's token). Managed memory cannot be exported
 * (CUDA has no IPC for it): UVM_ERROR_UNSUPPORTED naming that; so does a device whose driver cannot
 * export VMM memory. The allocation must be on its device: an offloaded or paused one fails,
 * UVM_ERROR_INVALID_ARGUMENT. */
UVM_API uvm_status uvm_share_export(const void* ptr, uvm_share_handle* handle);

/* Maps the exported allocation in this process, read-write for `device` (the exporter's GPU, or a
 * peer of it), and gives the address matching the exported pointer. The exporter hands over the
 * memory's file descriptor through the socket (SCM_RIGHTS) and counts this process among the
 * allocation's importers until uvm_share_close: meanwhile an offload, discard or pause of it there
 * fails with UVM_ERROR_SHARED naming this process, so no importer reads memory given back or bytes
 * moved away. An importer that exits or crashes counts no longer. If the exporter frees the
 * allocation, the memory stays for the importers until they close it. Fails naming the exporter's
 * process when it is gone or refuses (the allocation freed, offloaded, or the token not the export's),
 * and sends nothing to a process that is not the exporter (its socket's name taken after it exited).
 * Imports of one allocation for one device share one mapping in this process (a model's tensors,
 * sent one by one): only the first asks the exporter and maps; each import is closed once. */
UVM_API uvm_status uvm_share_import(const uvm_share_handle* handle, int device, void** ptr);

/* Closes an import at `ptr` (the pointer uvm_share_import gave). The last import of a mapping to
 * close unmaps it and tells the exporter, which has counted this process out when the call returns;
 * it waits for this process's work on the device first (cudaDeviceSynchronize). */
UVM_API uvm_status uvm_share_close(void* ptr);

/* The processes that map the releasable allocation holding `ptr` now: up to `capacity` ids in
 * `pids` (may be NULL with capacity 0), their number in `*count`. */
UVM_API uvm_status uvm_share_importers(const void* ptr, int* pids, size_t capacity, size_t* count);

/* ------------------------------------------------------------------------------------------------
 * Residency queries
 * ---------------------------------------------------------------------------------------------- */

/* Where uvm last put the bytes of a set of allocations. The driver may move pages on its own (on
 * access or under pressure); these counts are what uvm moved, the numbers cudaMemGetInfo lacks. */
typedef struct uvm_residency {
  size_t allocations;     /* live uvm allocations counted */
  size_t live_bytes;      /* their bytes */
  size_t device_bytes;    /* not moved off their device by uvm */
  size_t host_bytes;      /* offloaded or prefetched to the host (includes staged_bytes) */
  size_t staged_bytes;    /* held in uvm's pinned staging memory */
  size_t discarded_bytes; /* discarded, with no copy kept */
  size_t released_bytes;  /* of releasable allocations whose physical memory uvm gave back to the
                             driver (cudaMemGetInfo counts it free) or keeps as spare memory
                             (uvm_set_spare_limit) */
} uvm_residency;

/* Fills `residency` for the allocations of `device` (or UVM_ANY_DEVICE) with tag `tag` (NULL: any;
 * "": untagged). Touches no CUDA context. */
UVM_API uvm_status uvm_get_residency(int device, const char* tag, uvm_residency* residency);

/* Free and total memory of `device` as cudaMemGetInfo reports them, and `reclaimable`: the bytes of
 * uvm's managed allocations on it that uvm moved off it (offloaded or discarded). The driver counts
 * those as used until some allocation claims them (any allocation can), so free + reclaimable is
 * what an allocation could get — an upper bound once another allocation has claimed some of them,
 * which uvm cannot see. Released memory of releasable allocations is already in `free`. Any
 * out-pointer may be NULL. */
UVM_API uvm_status uvm_mem_get_info(int device, size_t* free_bytes, size_t* total_bytes, size_t* reclaimable_bytes);

/* The host copy uvm holds of [ptr, ptr + size) while those bytes are staged (offloaded with STAGED,
 * MMAP, or AUTO where it stages), for reading them while the device copy is away, or the retained
 * copy uvm_resume kept of them (uvm_set_retain_backups). Waits for the copy to be complete. Sets
 * *host to NULL (and returns UVM_OK) if the bytes are neither staged nor retained in one piece.
 * A staged copy stays valid until the bytes are onloaded, discarded or freed (writing to it changes
 * what onload brings back); a retained one until uvm_set_retain_backups says it goes. */
UVM_API uvm_status uvm_get_staged_copy(const void* ptr, size_t size, const void** host);

/* Number of distinct tags used so far, and the name of tag `index` (NULL past the end); for listing. */
UVM_API size_t uvm_tag_count(void);
UVM_API const char* uvm_tag_name(size_t index);

/* Preferred location and last-prefetch location of the whole range (cudaMemRangeGetAttribute): a
 * device ordinal, UVM_LOCATION_CPU, or UVM_LOCATION_NONE when unset or mixed. Either out-pointer may
 * be NULL. */
UVM_API uvm_status uvm_query_location(const void* ptr, size_t size, int* preferred_location,
                                      int* last_prefetch_location);

/* ------------------------------------------------------------------------------------------------
 * Move reports and tracing — what each move spent where, for when a sleep or wake is slow
 * ---------------------------------------------------------------------------------------------- */

/* One phase of a move. Phases on a stream are timed with CUDA events, phases on the host with the
 * host clock; phases overlap (the next allocation's mapping runs beside the copies before it). */
typedef struct uvm_move_phase {
  const char* name;    /* "pin" (staging memory), "wait" (host waits for copies), "copy", "discard",
                          "release" and "map" (physical memory of releasable allocations),
                          "populate" (an onload's page population), "migrate" (a prefetch),
                          "write" and "read" (mmap and disk copies, through bounce buffers),
                          "code" (compressed copies: coded on the GPU and copied out, or back) */
  size_t bytes;        /* bytes it moved or handled (0 for waits) */
  uint32_t operations; /* timed operations: a batch of copies, a chunk, an allocation, a driver call */
  double start;        /* seconds from the call's start to its first operation's start */
  double seconds;      /* from its first operation's start to its last one's end */
} uvm_move_phase;

#define UVM_MOVE_PHASES 8 /* the most phases one move reports (of the 11 kinds, a move runs at most 8) */

/* A move call (prefetch, offload, onload, discard) phase by phase. */
typedef struct uvm_move_report {
  const char* call;     /* the entry, e.g. "uvm_offload_ranges"; NULL when there is no move to report */
  int device;           /* the device it ran on */
  uvm_status status;    /* what it returned */
  size_t bytes;         /* bytes it moved */
  double seconds;       /* from the call's start to the end of its last phase (on the GPU too) */
  double host_seconds;  /* how long the call itself took to return */
  size_t phase_count;
  uvm_move_phase phases[UVM_MOVE_PHASES]; /* in order of start */
} uvm_move_report;

/* The last move this thread made on `device` (UVM_ANY_DEVICE: on any device), once its work on the
 * GPU is done (waits for it). A move that failed before reaching a device is not recorded. With no
 * such move, `report->call` is NULL. Recording costs two CUDA events a phase (an onload chunk has
 * three phases). Moves are also marked as NVTX ranges (domain "uvm") for Nsight Systems. */
UVM_API uvm_status uvm_last_move(int device, uvm_move_report* report);

/* With env UVM_TRACE=<file> ("%p" in it becomes the process id), every move's phases are written
 * there as Chrome trace events (chrome://tracing, ui.perfetto.dev) once their GPU work is done; the
 * file is valid JSON after every write. Flush waits for the moves still running and writes them:
 * call it before the process exits (the Python shim does, at exit). UVM_ERROR_INVALID_ARGUMENT if
 * the file cannot be written; UVM_OK without UVM_TRACE. */
UVM_API uvm_status uvm_trace_flush(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* UVM_H */
