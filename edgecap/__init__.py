"""edgecap: caption live video on ARM boards with Coral EdgeTPUs.

The public face: what a user of the Python API needs, importable from here::

    from edgecap import EdgeCaptioner, EdgecapError

    with EdgeCaptioner("models/demo/bundle") as cap:
        for caption in cap.stream("clip.mp4"):
            print(caption.start_time, caption.text)

Each name is loaded when first used (a module ``__getattr__``, PEP 562), so
``import edgecap`` itself imports nothing: the command line, the service and
the compiler pay only for the modules they use.
"""

from importlib import import_module as _import_module

__version__ = "0.1.0"

# Public name -> the module that defines it.
_PUBLIC = {
    # Captioning.
    "EdgeCaptioner": "edgecap.captioner",
    "Caption": "edgecap.captioner",
    "CaptionerOptions": "edgecap.options",
    "PipelineStats": "edgecap.stats",
    "Event": "edgecap.events",
    "EventRule": "edgecap.events",
    # Model bundles.
    "Bundle": "edgecap.bundle",
    "load_bundle": "edgecap.bundle",
    # Errors: bad input (EdgecapError and its subclasses), failures at run time (RunFailure).
    "EdgecapError": "edgecap.errors",
    "BundleError": "edgecap.errors",
    "ConfigError": "edgecap.errors",
    "PlanError": "edgecap.errors",
    "SourceError": "edgecap.errors",
    "PipelineBusy": "edgecap.errors",
    "RunCancelled": "edgecap.errors",
    "DeviceFailed": "edgecap.errors",
    "RunFailure": "edgecap.errors",
    "StageFailed": "edgecap.errors",
}

__all__ = list(_PUBLIC)

# What type checkers and editors see; at run time __getattr__ loads each name. The constant
# stands in for typing.TYPE_CHECKING (type checkers know it by its name): importing typing
# would triple the cost of `import edgecap`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from edgecap.bundle import Bundle, load_bundle
    from edgecap.captioner import Caption, EdgeCaptioner
    from edgecap.errors import (BundleError, ConfigError, DeviceFailed, EdgecapError, PipelineBusy, PlanError,
                                RunCancelled, RunFailure, SourceError, StageFailed)
    from edgecap.events import Event, EventRule
    from edgecap.options import CaptionerOptions
    from edgecap.stats import PipelineStats
del TYPE_CHECKING


def __getattr__(name: str) -> object:
    """Imports a public name's module on first use and keeps the name here.

    Raises:
      AttributeError: If ``name`` is not public (``from edgecap import x`` then
        imports the submodule ``edgecap.x`` as usual).
    """
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'edgecap' has no attribute {name!r}")
    value = getattr(_import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> "list[str]":
    """The public names, loaded or not, beside what the module holds already (submodules once imported)."""
    return sorted(set(globals()) | set(__all__))
