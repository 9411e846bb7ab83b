/* uvm_preload.h — uvm's cudaMalloc interposer (libuvm_preload.so), torch_memory_saver's preload mode.
 *
 * A process started with LD_PRELOAD=libuvm_preload.so (uvm.memory_saver.configure_subprocess() sets
 * it) has its cudaMalloc and cudaFree go through this library first:
 *   - cudaMalloc on a thread inside a region (uvm_preload_set_region(1)) becomes
 *     uvm_malloc_releasable on the current device, with the thread's uvm tag and backup
 *     (uvm_set_thread_tag, uvm_set_thread_backup): pausable with uvm_pause/uvm_resume.
 *   - cudaMalloc outside a region, and cudaFree of any pointer this library did not hand out, go to
 *     the CUDA runtime untouched (the same function, the same arguments, its own result).
 *   - cudaFree of a pointer it handed out is uvm_free of that allocation (paused or not).
 * Nothing else is interposed: cudaMallocAsync/cudaFreeAsync (torch's cudaMallocAsync backend), the
 * driver API (torch's expandable segments), cudaMallocManaged, cudaMallocPitch and cudaMallocHost
 * reach the runtime or the driver directly, so memory from them is never pausable
 * (uvm.memory_saver refuses those torch settings in preload mode).
 *
 * Where $UVM_PRELOAD_LIBUVM or $UVM_PRELOAD_CUDART is set, the library opens libuvm at load:
 * $UVM_PRELOAD_LIBUVM, else the libuvm.so beside it, after the CUDA runtime named by
 * $UVM_PRELOAD_CUDART if set (the file the parent process used, so that torch finds the same one).
 * Where neither is set (a process started with LD_PRELOAD and TMS_INIT_* alone, as slime starts its
 * train actors), it opens libuvm at first need, once the process has loaded a CUDA runtime: the
 * libuvm.so beside it, else the one in its cuda<major>/ folder for that runtime's major (the
 * wheel's layout); libuvm's libcudart.so.<major> is then the file the process loaded. When
 * libuvm cannot be opened it records why (uvm_preload_load_error) and the
 * process runs on: calls outside a region reach the runtime as before (the interposer reaches every
 * descendant of a configured process: shells, compilers), and a cudaMalloc inside a region fails
 * with cudaErrorInitializationError, printing the reason. The runtime's functions are looked up
 * until found: in the global scope after this library, else in a runtime loaded without
 * RTLD_GLOBAL (a library's own). The initial state of each thread follows
 * torch_memory_saver's environment: TMS_INIT_ENABLE=1 starts every thread inside a region with tag
 * "default", TMS_INIT_ENABLE_CPU_BACKUP=1 with a host backup, TMS_INIT_CPU_BACKUP_BACKEND=mmap with
 * an mmap one. torch_memory_saver's own C names (tms_pause, tms_get_interesting_region, …) are
 * exported too, on top of these (preload/tms_names.cpp), for programs that call them.
 */
#ifndef UVM_PRELOAD_H
#define UVM_PRELOAD_H

#include "uvm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when this library is the process's cudaMalloc (it was preloaded), 0 when it was only opened. */
UVM_API int uvm_preload_active(void);

/* Why libuvm could not be opened, or NULL when it was (where it opens at first need, this asks for it). */
UVM_API const char* uvm_preload_load_error(void);

/* The path of the libuvm it opened (or tried last): the library a Python shim in this process must
 * load too. Where it opens at first need, this asks for it. */
UVM_API const char* uvm_preload_libuvm_path(void);

/* Puts this thread's later cudaMalloc calls inside (1) or outside (0) a region. */
UVM_API uvm_status uvm_preload_set_region(int inside);

/* 1 when this thread is inside a region. */
UVM_API int uvm_preload_get_region(void);

/* Keeps this thread's regions to one device (UVM_ANY_DEVICE, the default: any): a cudaMalloc inside
 * a region on another device fails with cudaErrorInvalidDevice, naming both, rather than put region
 * memory in that device's default pool (uvm.memory_saver sets its region's device). */
UVM_API uvm_status uvm_preload_set_region_device(int device);

/* The device this thread's regions are kept to, or UVM_ANY_DEVICE. */
UVM_API int uvm_preload_get_region_device(void);

/* uvm_pause of `tag` on every device; NULL: of every tag this library allocated under. */
UVM_API uvm_status uvm_preload_pause(const char* tag);

/* uvm_resume of `tag` on every device; NULL: of every tag this library allocated under. */
UVM_API uvm_status uvm_preload_resume(const char* tag);

/* The tags this library has allocated under, in first-use order; NULL past the last. */
UVM_API const char* uvm_preload_tag_name(size_t index);

/* How many allocations it handed out are live (not yet freed). */
UVM_API size_t uvm_preload_live_allocations(void);

#ifdef __cplusplus
}
#endif

#endif /* UVM_PRELOAD_H */
