"""uvm's exceptions, all in one place: the build's own, and the names Megatron-Core's
`unified_memory` module raises (so that callers catching those keep working)."""
from __future__ import annotations


class BuildError(RuntimeError):
    """The compiler could not be run or failed; the message says which and why."""


class BuildTimeout(BuildError):
    """The build ran past its timeout and was killed."""


class UnifiedMemoryUnsupportedError(Exception):
    """Unified memory cannot be used here; the message says why and what to do."""


class UnifiedMemoryCompileTimeoutError(UnifiedMemoryUnsupportedError):
    """Building the allocator ran past its timeout (UVM_COMPILE_TIMEOUT_S); the compiler was killed."""
