r"""Every access to private internals of PyG, Lightning and pymetis, in one place.

The engine hooks into unmodified PyG layers and overrides parts of Lightning's loop, which
needs a few attributes that those projects do not promise to keep (PyG's ``_user_args``,
its hook dictionaries, the module namespaces that hold ``gcn_norm``; Lightning's signal
connector, random-state helpers, CLI detection and the loops' data sources; pymetis' extension
module).  They are reached only through the functions below, and :func:`require` checks that
the installed version is one this release was tested with: outside those ranges it warns
(:class:`UntestedVersionWarning`, once per package), it does not fail; an internal that is
genuinely missing fails where it is used, naming the version.  Silence the warning with
``warnings.filterwarnings("ignore", category=UntestedVersionWarning)``.
"""
import importlib
import re
import sys
import warnings
from importlib import metadata
from types import ModuleType
from typing import Any, Callable, Dict, Iterator, Optional, Set, Tuple

__all__ = [
    "TESTED_VERSIONS", "UntestedVersionWarning", "UntestedVersionError", "require",
    "installed_version",
    "propagate_source_args", "edge_update_source_args", "hook_dicts", "set_hook_dict",
    "modules_binding", "has_forward_hooks", "pyg_gcn_norm", "route_gcn_norm",
    "unroute_gcn_norm", "gcn_norm_router", "add_gcn_norm_handler", "remove_gcn_norm_handler",
    "OBSERVING_HOOKS", "rows_observed",
    "fabric_is_using_cli", "signal_connector", "stage_data_sources",
    "attach_datamodule", "collect_rng_states", "set_rng_states",
    "pymetis_extension_path", "pymetis_option_indices",
]

#: ``package -> (lowest tested, first untested)``: versions ``>= low`` and ``< high`` were
#: tested (CI runs the suite on the newest and a smoke subset on the oldest:
#: ``scripts/smoke_versions.sh``).  ``pyproject.toml`` requires the lowest; a newer release
#: only warns.
TESTED_VERSIONS: Dict[str, Tuple[str, str]] = {
    "torch_geometric": ("2.7", "2.9"),
    "lightning": ("2.5", "2.7"),
    "pymetis": ("2025.1", "2026"),
}

_DIST_NAMES = {"torch_geometric": "torch_geometric", "lightning": "lightning", "pymetis": "pymetis"}
_checked: Set[str] = set()


class UntestedVersionWarning(UserWarning):
    r"""An installed dependency is outside the versions this release was tested with."""


class UntestedVersionError(RuntimeError):
    r"""A private internal this library needs is missing from the installed version."""


def _parse(version: str) -> Tuple[int, ...]:
    # Leading numeric components only: "2.8.1", "2.9.0rc1" -> (2, 9, 0), "2025.2.2".
    parts = []
    for piece in version.split("."):
        match = re.match(r"\d+", piece)
        if match is None:
            break
        parts.append(int(match.group()))
    return tuple(parts)


def installed_version(package: str) -> str:
    r"""Version string of an installed distribution (``"0"`` if it has no metadata)."""
    try:
        return metadata.version(_DIST_NAMES.get(package, package))
    except metadata.PackageNotFoundError:
        module = sys.modules.get(package)
        return str(getattr(module, "__version__", "0"))


def require(package: str) -> None:
    r"""Warns once (:class:`UntestedVersionWarning`) when :obj:`package` has a version this
    release was not tested with, naming the installed and the tested versions."""
    if package in _checked:
        return
    _checked.add(package)
    low, high = TESTED_VERSIONS[package]
    found = installed_version(package)
    if _parse(low) <= _parse(found) < _parse(high):
        return
    warnings.warn(
        f"lightning-fullgraph uses internals of {package} and was tested with "
        f"{package}>={low},<{high}, but {found} is installed: it may work; if something "
        f"fails, install a tested version (pip install '{package}>={low},<{high}') and report "
        "the failure at the project's issue tracker.", UntestedVersionWarning, stacklevel=3)


def _missing(package: str, what: str) -> UntestedVersionError:
    r"""The error of a feature whose private internal :obj:`what` is missing from the installed
    :obj:`package` (raised where the feature is used, not at import)."""
    low, high = TESTED_VERSIONS[package]
    return UntestedVersionError(
        f"{what} is missing from {package} {installed_version(package)}: lightning-fullgraph "
        f"needs it here and was tested with {package}>={low},<{high}; install a tested version "
        f"(pip install '{package}>={low},<{high}') and report the failure at the project's "
        "issue tracker")


def _internal(package: str, module: str, name: str) -> Any:
    r"""``module.name``, a private internal of :obj:`package`; :class:`UntestedVersionError`
    naming the installed version if that version lacks it."""
    require(package)
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise _missing(package, f"{module}.{name}") from exc


# -- PyG -----------------------------------------------------------------------------------
def propagate_source_args(layer: Any) -> Tuple[str, ...]:
    r"""Names of ``propagate`` arguments a layer reads per *source* node (``x`` for ``x_j``).

    PyG's inspector stores the ``message``/``aggregate``/``update`` arguments in
    ``_user_args``; those ending in ``_j`` are gathered from source rows.  Sorted: every
    rank exchanges them in this order, and a set's order of strings differs between
    processes (hash randomization), which would pair different collectives.
    """
    return tuple(sorted({n[:-2] for n in _layer_attr(layer, "_user_args") if n.endswith("_j")}))


def edge_update_source_args(layer: Any) -> Tuple[str, ...]:
    r"""As :func:`propagate_source_args` for ``edge_updater`` (``alpha`` for ``alpha_j``)."""
    return tuple(sorted({n[:-2] for n in _layer_attr(layer, "_edge_user_args")
                         if n.endswith("_j")}))


def _layer_attr(layer: Any, name: str) -> Any:
    # A MessagePassing attribute; UntestedVersionError if the installed PyG has none.
    try:
        return getattr(layer, name)
    except AttributeError as exc:
        raise _missing("torch_geometric", f"MessagePassing.{name}") from exc


def hook_dicts(layer: Any, kind: str) -> Dict[Any, Callable]:
    r"""One of a ``MessagePassing`` layer's hook dictionaries.

    Args:
        kind (str): ``"propagate_pre"``, ``"propagate"``, ``"message_pre"``, ``"message"``,
            ``"aggregate_pre"``, ``"aggregate"``, ``"message_and_aggregate_pre"``,
            ``"message_and_aggregate"``, ``"edge_update_pre"`` or ``"edge_update"``.
    """
    name = kind[:-4] + "_forward_pre_hooks" if kind.endswith("_pre") else kind + "_forward_hooks"
    return _layer_attr(layer, "_" + name)


def set_hook_dict(layer: Any, kind: str, hooks: Dict[Any, Callable]) -> None:
    r"""Replaces a hook dictionary (used to run PyG's ``propagate`` without its pre-hooks)."""
    name = kind[:-4] + "_forward_pre_hooks" if kind.endswith("_pre") else kind + "_forward_hooks"
    setattr(layer, "_" + name, hooks)


#: A ``MessagePassing`` layer's hooks that see the rows it aggregates (their width, their order).
OBSERVING_HOOKS = ("propagate_pre", "propagate", "message_pre", "message", "aggregate_pre",
                   "aggregate", "message_and_aggregate_pre", "message_and_aggregate")


def rows_observed(layer: Any, own_hooks: Any = ()) -> bool:
    r"""Whether something would see the rows :obj:`layer` aggregates, so a shortcut that
    aggregates other rows (another width, another order) must not be taken: explain mode,
    ``decomposed_layers``, or a hook on ``propagate``, ``message`` or ``aggregate`` whose id is
    not in :obj:`own_hooks` (the library's own hooks)."""
    if getattr(layer, "explain", False) or getattr(layer, "decomposed_layers", 1) != 1:
        return True
    return any(hook_id not in own_hooks for kind in OBSERVING_HOOKS
               for hook_id in hook_dicts(layer, kind))


def has_forward_hooks(module: Any) -> bool:
    r"""Whether a forward hook (the module's own or a global one) may see the output of
    :obj:`module` (then the output must not be modified in place)."""
    import torch
    return bool(module._forward_hooks) or bool(torch.nn.modules.module._global_forward_hooks)


def call_is_observed(module: Any, ignore: Tuple[Callable, ...] = ()) -> bool:
    r"""Whether using :obj:`module`'s parameters directly, instead of calling it, would skip a
    hook: one of its own forward (pre-)hooks or a global one not in :obj:`ignore`."""
    from torch.nn.modules import module as nn_module
    if module._forward_hooks or module._forward_pre_hooks:
        return True
    hooks = list(nn_module._global_forward_hooks.values()) \
        + list(nn_module._global_forward_pre_hooks.values())
    return any(h not in ignore for h in hooks)


def modules_binding(function: Callable, prefix: str = "torch_geometric") -> Iterator[ModuleType]:
    r"""Loaded modules under :obj:`prefix` whose global ``function.__name__`` is :obj:`function`.

    PyG's convolutions call ``gcn_norm`` through their own module globals
    (``sg_conv.gcn_norm``, ...), so rebinding those names is how a distributed version
    reaches them without editing PyG.
    """
    name = function.__name__
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith(prefix) \
                and getattr(module, name, None) is function:
            yield module


# -- PyG's gcn_norm, routed ------------------------------------------------------------------
# Two parts of the library act on PyG's gcn_norm calls: the distributed engine (halo degrees,
# inside partitioned layers) and the kernels (a memo, inside accelerated layers). Both go
# through one rebinding of the module globals, so neither hides PyG's function from the
# other. (A scoped copy of each layer's forward was tried: torch.compile adds its resume
# functions to a function's real module globals, which the copy does not see, and models
# such as LabelPropagation call gcn_norm outside any layer.) Handlers run by priority
# (lowest first); a handler returns NotImplemented to pass.
_gcn_norm_box: dict = {"pyg": None}  # PyG's function, once recorded (the router calls it)
_gcn_norm_handlers: list = []  # (priority, order, handler)
_gcn_norm_rebound: list = []  # (module, its function before) where the router is
_gcn_norm_order = [0]
_gcn_norm_routes = [0]  # global routes (route_gcn_norm) in effect


def pyg_gcn_norm() -> Callable:
    r"""PyG's own ``gcn_norm`` (``torch_geometric.nn.conv.gcn_conv.gcn_norm`` as PyG defines
    it), whether or not it is routed now."""
    global _route
    if _gcn_norm_box["pyg"] is None:
        from torch_geometric.nn.conv import gcn_conv
        fn = gcn_conv.gcn_norm
        if _route is not None and fn is _route:
            raise RuntimeError("gcn_norm was routed before PyG's function was recorded")
        _route = _make_router(fn, gcn_conv)
    return _gcn_norm_box["pyg"]


def _make_router(original: Callable, home: Any) -> Callable:
    r"""The router: a function that PyG's modules call as ``gcn_norm``, built in the globals
    of PyG's own module (:obj:`home`) under PyG's name and wrapping PyG's function.

    ``torch.jit.script`` of a PyG layer compiles the ``gcn_norm`` its module binds: finding
    the router under PyG's qualified name, with PyG's ``@overload`` declarations and, through
    ``__wrapped__``, PyG's source and globals, it compiles PyG's own function; the scripted
    layer calls that.  In Python it runs the handlers (by priority; one returning
    ``NotImplemented`` passes), then PyG's function.  Plain Python: under torch.compile a
    handler that cannot be traced is compile-disabled itself (the engine's), one that only
    applies in eager mode passes (the kernels')."""
    import functools
    import types
    handlers, box = _gcn_norm_handlers, _gcn_norm_box
    box["pyg"] = original

    def gcn_norm(*args: Any, **kwargs: Any) -> Any:
        for _priority, _order, handler in handlers:
            out = handler(*args, **kwargs)
            if out is not NotImplemented:
                return out
        return box["pyg"](*args, **kwargs)

    # Only closure cells and builtins are read, so PyG's module globals serve as well.
    router = types.FunctionType(gcn_norm.__code__, vars(home), "gcn_norm", None,
                                gcn_norm.__closure__)
    return functools.wraps(original)(router)


_route: Optional[Callable] = None  # made with PyG's function (pyg_gcn_norm)


def gcn_norm_router() -> Callable:
    r"""The function PyG's modules call as ``gcn_norm`` while a handler is routed."""
    pyg_gcn_norm()
    return _route


def add_gcn_norm_handler(handler: Callable, priority: int = 0) -> None:
    r"""Puts :obj:`handler` in the router's chain without rebinding any module: it answers
    the calls made through the router (:func:`gcn_norm_router`), i.e. every PyG call while
    some handler is routed globally (:func:`route_gcn_norm`).

    The handler is called with ``gcn_norm``'s arguments and returns its result, or
    :obj:`NotImplemented` to leave the call to the next handler and in the end to PyG.
    Reference counted: a handler added twice must be removed twice.
    """
    pyg_gcn_norm()  # PyG's function, recorded before anything calls the router
    _gcn_norm_order[0] += 1
    _gcn_norm_handlers.append((int(priority), _gcn_norm_order[0], handler))
    _gcn_norm_handlers.sort(key=lambda entry: entry[:2])


def remove_gcn_norm_handler(handler: Callable) -> None:
    r"""Undoes one :func:`add_gcn_norm_handler` of :obj:`handler`."""
    for i, entry in enumerate(_gcn_norm_handlers):
        if entry[2] is handler:
            del _gcn_norm_handlers[i]
            break


def route_gcn_norm(handler: Callable, priority: int = 0) -> None:
    r"""Puts :obj:`handler` in front of PyG's ``gcn_norm`` in every loaded PyG module that
    calls it (``gcn_conv``, ``sg_conv``, ``appnp``, ...), until :func:`unroute_gcn_norm`:
    a process-wide change while a model is attached or accelerated.

    See :func:`add_gcn_norm_handler` for the handler.  Reference counted: a handler routed
    twice must be unrouted twice.  A module whose ``gcn_norm`` someone else replaced is left
    alone.
    """
    original = pyg_gcn_norm()
    add_gcn_norm_handler(handler, priority)
    _gcn_norm_routes[0] += 1
    for module in modules_binding(original):  # again: PyG may have loaded more modules
        setattr(module, "gcn_norm", _route)
        _gcn_norm_rebound.append((module, original))


def unroute_gcn_norm(handler: Callable) -> None:
    r"""Undoes one :func:`route_gcn_norm` of :obj:`handler`; with the last global route gone,
    PyG's modules call PyG's function again (those whose ``gcn_norm`` is still the router)."""
    remove_gcn_norm_handler(handler)
    _gcn_norm_routes[0] = max(0, _gcn_norm_routes[0] - 1)
    if not _gcn_norm_routes[0]:
        while _gcn_norm_rebound:
            module, original = _gcn_norm_rebound.pop()
            if getattr(module, "gcn_norm", None) is _route:
                setattr(module, "gcn_norm", original)


# -- Lightning -------------------------------------------------------------------------------
def fabric_is_using_cli() -> bool:
    r"""Whether the process was started by ``fabric run`` (Lightning's launcher sets env vars)."""
    return bool(_internal("lightning", "lightning.fabric.connector", "_is_using_cli")())


def signal_connector(trainer: Any) -> Any:
    r"""The Trainer's signal connector (``received_sigterm``, SLURM requeue handler)."""
    require("lightning")
    try:
        return trainer._signal_connector
    except AttributeError as exc:
        raise _missing("lightning", "Trainer._signal_connector") from exc


def lightning_launchers() -> Tuple[type, type]:
    r"""Lightning's launchers of ``DDPStrategy``: the one that re-runs the script per rank
    (``start_method="popen"``) and the multiprocessing one (``"spawn"``, ``"fork"``)."""
    launchers = "lightning.pytorch.strategies.launchers."
    return (_internal("lightning", launchers + "subprocess_script", "_SubprocessScriptLauncher"),
            _internal("lightning", launchers + "multiprocessing", "_MultiProcessingLauncher"))


def set_group_timeout(timeout: Any, group: Any = None) -> None:
    r"""Sets the timeout of the collectives of an existing process group (default: the
    default group), for gloo and NCCL."""
    from torch.distributed.distributed_c10d import _set_pg_timeout
    _set_pg_timeout(timeout, group)


def stage_data_sources(trainer: Any) -> Dict[str, Any]:
    r"""Where the running stage's dataloaders come from, by dataloader hook name.

    Each value is Lightning's ``_DataLoaderSource``: ``.instance`` is a LightningDataModule, the
    LightningModule or the dataloaders passed to ``fit``/``validate``/``test``/``predict``;
    ``.is_defined()`` says whether a module instance defines the hook.  Empty outside a stage.
    """
    require("lightning")
    from lightning.pytorch.trainer.states import TrainerFn
    loops = {TrainerFn.FITTING: (("train_dataloader", trainer.fit_loop),
                                 ("val_dataloader", trainer.fit_loop.epoch_loop.val_loop)),
             TrainerFn.VALIDATING: (("val_dataloader", trainer.validate_loop),),
             TrainerFn.TESTING: (("test_dataloader", trainer.test_loop),),
             TrainerFn.PREDICTING: (("predict_dataloader", trainer.predict_loop),)}
    try:
        return {name: loop._data_source for name, loop in loops.get(trainer.state.fn, ())}
    except AttributeError as exc:
        raise _missing("lightning", "the loops' _data_source") from exc


def attach_datamodule(trainer: Any, module: Any, datamodule: Any) -> None:
    r"""Makes :obj:`datamodule` the Trainer's data module for the running stage, as
    ``trainer.fit(module, datamodule=datamodule)`` would have (loops' sources, data hooks,
    ``trainer.datamodule``)."""
    require("lightning")
    try:
        attach = trainer._data_connector.attach_datamodule
    except AttributeError as exc:
        raise _missing("lightning", "Trainer._data_connector.attach_datamodule") from exc
    attach(module, datamodule=datamodule)


def collect_rng_states() -> Dict[str, Any]:
    r"""torch (CPU and CUDA), numpy and Python random states, as Lightning collects them."""
    import torch
    collect = _internal("lightning", "lightning.fabric.utilities.seed", "_collect_rng_states")
    return collect(include_cuda=torch.cuda.is_available())


def set_rng_states(states: Dict[str, Any]) -> None:
    r"""Inverse of :func:`collect_rng_states`."""
    _internal("lightning", "lightning.fabric.utilities.seed", "_set_rng_states")(states)


# -- pymetis ---------------------------------------------------------------------------------
def pymetis_extension_path() -> str:
    r"""File of pymetis' compiled extension, which exports the METIS C API.

    pymetis' Python API always calls METIS with one balance constraint; the multi-constraint
    partitioner is called through this library's ``METIS_PartGraphKway`` symbol.
    """
    return _internal("pymetis", "pymetis._internal", "__file__")


def pymetis_option_indices() -> Any:
    r"""Positions of METIS options (``SEED``, ``UFACTOR``) in the options array."""
    return _internal("pymetis", "pymetis._internal", "options_indices")



# -- torch autograd --------------------------------------------------------------------------
def in_backward() -> bool:
    r"""Whether this thread is running a backward pass (``backward()`` or
    ``torch.autograd.grad``) right now."""
    import torch
    return torch._C._current_graph_task_id() != -1


def will_accumulate(param: Any) -> bool:
    r"""Whether the backward pass running now accumulates a gradient into ``param.grad``.

    ``False`` for a parameter the pass does not reach and in ``torch.autograd.grad``, which
    returns the gradients instead of accumulating them (torch refuses to answer for a leaf
    that call captures: that, too, means no accumulation).  Only valid inside a backward pass
    (in a tensor hook or a queued callback).
    """
    import torch
    from torch.autograd.graph import get_gradient_edge
    try:
        return bool(torch._C._will_engine_execute_node(get_gradient_edge(param).node))
    except RuntimeError:  # "A leaf node was passed ... running autograd.grad()"
        return False


def queue_backward_callback(callback: Callable[[], None]) -> None:
    r"""Runs :obj:`callback` once the running backward pass has completed (every gradient
    accumulated), before ``backward()`` returns; an exception it raises is raised by
    ``backward()``.  Only valid inside a backward pass."""
    import torch
    torch.autograd.Variable._execution_engine.queue_callback(callback)
