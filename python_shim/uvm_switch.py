"""The switch that moves a stack onto uvm without editing it: with UVM_SWITCH set, `import
torch_memory_saver` gives uvm.memory_saver's API, `megatron.core.inference.unified_memory` gives
uvm, and vLLM's cumem module gets uvm's sleep-mode allocator as its CuMemAllocator (uvm.vllm), in
this process and in every process it starts (they inherit the environment).

The wheel installs uvm_switch.pth and this module beside the package; Python runs the .pth at every
start, and it imports this module only when UVM_SWITCH is set (otherwise it costs one environment
lookup). install() puts a finder first on sys.meta_path for the switched names. This module lies
outside the uvm package, so that a process pays for uvm's modules only when it imports a switched
name (uvm/__init__ would load the library's bindings at every start). Unset, nothing is switched and
the originals import as before, where they are installed. uvm._switch is this module.

    UVM_SWITCH=1 (or "all")                 all three
    UVM_SWITCH=torch_memory_saver,vllm      a comma-separated choice (torch_memory_saver, megatron, vllm)
    UVM_SWITCH=0 (off, false, no) or unset  off
"""
import os
import sys

# What each switch name stands in for: {switch name: module name}.
TARGETS = {"torch_memory_saver": "torch_memory_saver", "megatron": "megatron.core.inference.unified_memory",
           "vllm": "vllm.device_allocator.cumem"}
ENV = "UVM_SWITCH"


OFF = ("", "0", "off", "false", "no")  # uvm_switch.pth reads the same (and imports nothing for them)
ON = ("1", "all", "on", "true", "yes")
_told: set = set()  # bad values said on stderr in this process (the .pth may run twice: once each)


def switched() -> dict[str, str]:
    """{module name: switch name} of what UVM_SWITCH asks for. Raises ValueError naming an unknown
    name."""
    value = os.environ.get(ENV, "").strip()
    if value.lower() in OFF:
        return {}
    if value.lower() in ON:
        names = list(TARGETS)
    else:
        names = [name.strip() for name in value.split(",") if name.strip()]
        unknown = [name for name in names if name not in TARGETS]
        if unknown:
            raise ValueError(f"{ENV}={value!r} names {unknown}: use 1 (or all), 0 (or off), or a comma-separated "
                             f"choice of {', '.join(TARGETS)}")
    return {TARGETS[name]: name for name in names}


def original_location(module: str) -> str | None:
    """Where the original of `module` is installed (None if it is not), found past the switch."""
    import importlib
    import importlib.machinery
    parent, _, _ = module.rpartition(".")
    try:
        path = importlib.import_module(parent).__path__ if parent else None
    except ImportError:
        return None
    spec = importlib.machinery.PathFinder.find_spec(module, path)
    return spec.origin if spec is not None else None


class _Alias:  # an import loader (importlib.abc.Loader's protocol; importing that module costs 13 ms)
    """Loads a switched name as uvm's module: the import statement receives it from sys.modules."""

    def __init__(self, switch: str):
        self.switch = switch

    def create_module(self, spec):
        return None  # a placeholder, replaced in exec_module

    def exec_module(self, module):
        name = module.__spec__.name
        if self.switch == "megatron":
            import uvm
            sys.modules[name] = uvm  # Megatron's callers reach its module state (_compilation_state...) too
            return
        import uvm.memory_saver as saver
        import uvm.tms_layout as layout
        # A package of its own: uvm's entry points, and the original's submodules as uvm answers
        # them (uvm.tms_layout), never the original's code, installed or not.
        for public in saver.__all__:
            setattr(module, public, getattr(saver, public))
        module.__all__ = list(saver.__all__)
        module.__uvm_switch__ = True
        module.__path__ = list(layout.__path__)
        module.__getattr__ = _file_on_demand


def _file_on_demand(name: str):
    """The switched torch_memory_saver's __file__, found when asked (uvm._preload.tms_package_file):
    slime's train actors preload the library two folders above it, so there lies uvm's interposer
    under the original's file names."""
    if name == "__file__":
        from uvm import _preload
        return _preload.tms_package_file()
    raise AttributeError(f"module 'torch_memory_saver' has no attribute {name!r}")


class _Patched:  # an import loader
    """Loads vLLM's own cumem module, then puts uvm's allocator in it (uvm.vllm.patch): vLLM's module
    stays, with its helpers, so that its tests and callers find what they import."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        from uvm import vllm
        vllm.patch(module)

    def __getattr__(self, name):  # get_source, get_filename...: tracebacks and inspect read vLLM's file
        return getattr(self.loader, name)


class _Finder:  # a meta path finder
    def __init__(self, names: dict[str, str]):
        self.names = names

    def find_spec(self, fullname, path=None, target=None):
        switch = self.names.get(fullname)
        if switch is None:
            return None
        import importlib.machinery  # here, not at start: a process that imports no switched name never needs it
        if switch == "vllm":
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is not None and spec.loader is not None:
                spec.loader = _Patched(spec.loader)
            return spec
        return importlib.machinery.ModuleSpec(fullname, _Alias(switch), is_package=switch == "torch_memory_saver")


def install() -> None:
    """Puts the finder first on sys.meta_path for what UVM_SWITCH asks for; once per process. A bad
    value is reported on stderr once and switches nothing: a process must start whatever the switch
    says."""
    if any(isinstance(finder, _Finder) for finder in sys.meta_path):
        return
    try:
        names = switched()
    except ValueError as error:
        if str(error) not in _told:
            _told.add(str(error))
            print(f"uvm: switch off: {error}", file=sys.stderr)
        return
    if names:
        sys.meta_path.insert(0, _Finder(names))


def active() -> dict[str, str]:
    """{module name: switch name} the finder in this process answers for."""
    for finder in sys.meta_path:
        if isinstance(finder, _Finder):
            return dict(finder.names)
    return {}
