"""The launch table: one launcher per (epoch, shape), bound once to its config.

A tuned op's call costs one epoch check and one dict lookup here. On a miss the table asks,
in order, the active resolver overrides (autotune()'s cache) and then the selector's chain
(user > system > cost model > default), and binds ``family.launch`` to the chosen config.
The entry is kept until the selector's epoch changes or an override is installed or removed,
so a CUDA graph captured after the first eager call replays exactly the kernel eager runs.
Resolution never synchronises with the device: it reads shapes and dtypes only.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator

from tunedb import families as _families
from tunedb.errors import SignatureError
from tunedb.records import Config, Signature
from tunedb.runtime import capture_chain, host_bound

# A resolver override answers (config, tier) for a shape, or None to let the next one answer.
Override = Callable[[Any, Signature, int], "tuple[Config, str] | None"]


class Count:
    """The call counter of a shape an override (autotune) serves; the selector's shapes count
    into the selector's own memo slot (selector.slot), which has the same `calls` field."""

    __slots__ = ("calls",)

    def __init__(self) -> None:
        self.calls = 0


class Bound:
    """A shape's resolution, the launcher bound to it, and how often it ran this epoch."""

    __slots__ = ("family", "signature", "m", "config", "tier", "call", "counter", "seen_captured", "key",
                 "launched", "eager", "direct")

    def __init__(self, family: str, signature: Signature, m: int, config: Config, tier: str,
                 call: Callable[..., Any], counter: Any = None) -> None:
        self.family = family
        self.signature = signature
        self.m = m
        self.config = config
        self.tier = tier  # "user" | "system" | "model" | "default" | "autotune"
        self.call = call
        self.counter = counter if counter is not None else Count()
        self.seen_captured = False  # TUNEDB_CAPTURE: whether a captured call was recorded
        # whether a call through first_launch succeeded (not `calls`: that counter can be the
        # selector's slot, which a selector.resolve() of the same shape counts as well)
        self.launched = False
        self.key: tuple[Any, ...] | None = None  # its launch-table key, once in the table
        self.eager: str | None = None  # the sentinel serving calls outside graph capture (host_bound)
        self.direct = direct_of(call)

    @property
    def calls(self) -> int:
        return self.counter.calls

    def __repr__(self) -> str:
        return (f"Bound({self.signature}, M={self.m}, config={self.config.id}, tier={self.tier}, "
                f"calls={self.calls})")


def direct_of(call: Callable[..., Any]) -> "Callable[..., Any] | None":
    """The launcher's `direct` attribute: a callable fn(x, weight, bias=None) computing exactly
    what call(x, weight, bias, None) computes, with no Python frame of its own (the GEMM torch
    arm without an activation names F.linear). The ops' memoised eager path calls it instead of
    the launcher; None (most launchers, a graph_only wrapper) means call the launcher."""
    return getattr(call, "direct", None)


# Keys are plain tuples (op, torch dtype, N, K, act, has_bias, M): built and hashed on every
# call, so they stay the cheapest structured key there is.
_table: dict[tuple[Any, ...], Bound] = {}
_epoch: list[Any] = [None]
_overrides: list[Override] = []
_recorders: list[list[tuple[str, Signature, int]]] = []
_capture: list[Any] = [None]  # TUNEDB_CAPTURE's path, read at each epoch start


def _selector() -> Any:
    from tunedb.runtime import selector
    return selector


_epoch_fn: list[Callable[[], Any]] = []


def _selector_epoch() -> Any:
    if not _epoch_fn:  # the selector's epoch is the database tiers' epoch: ask it directly
        from tunedb.database import tiers

        _epoch_fn.append(tiers.epoch)
    return _epoch_fn[0]()


# The kernel family whose linear-layer ops (x, weight, bias, act) this table keys: the registry's
# default family (tests point it at a fake).
FAMILY = _families.DEFAULT


def _family() -> Any:
    from tunedb import families

    return families.get(FAMILY)


# The ops' front memo: the full call key (op, act, x.shape, x.dtype, weight.shape, weight.dtype,
# bias.shape or None) of a call that already ran -> its Bound. A hit skips validation and the
# key arithmetic above; it holds only calls nothing needs to observe (no recorder, no capture).
_calls: dict[tuple[Any, ...], Bound] = {}
# known(key): the Bound of a call key already served this epoch, else None. The dict's own get
# (the dict is only ever cleared, never replaced): one C call on every eager tuned-op call.
known: Callable[[tuple[Any, ...]], "Bound | None"] = _calls.get
# Bumped whenever _calls is emptied (_forget_calls): a layer's own memo of its eager sizes
# (gemm/eager_sizes.py) holds for one generation, as the entries of _calls do.
generation: list[int] = [0]


def _forget_calls() -> None:
    _calls.clear()
    generation[0] += 1


# The compile token: the identity of this epoch's selection, computed when a compiler first asks
# for it in the epoch (compile_token) and forgotten by clear().
_selection_id: list["str | None"] = [None]


def compile_token() -> str:
    """What the ops' `tiers` argument carries when a compiler traces them: a hash of this
    epoch's selection state (tier file contents, arch, rankers, settings), with '+opaque'
    appended while an override, a recorder or TUNEDB_CAPTURE keeps the ops opaque. Dynamo
    reads it once per trace as a constant (no guard): a compiled graph keeps the choices it was
    compiled with, and every compile cache keyed on the graph tells selection states apart."""
    sync()
    ident = _selection_id[0]
    if ident is None:
        try:
            from tunedb.runtime.selection_identity import identity

            ident = identity(_selector(), _family(), __file__)
        except Exception:  # noqa: BLE001 - a token that can never match another process's
            import uuid

            ident = f"unidentified-{uuid.uuid4().hex[:12]}"
        _selection_id[0] = ident
    ident += _compile_form()
    return ident + "+opaque" if _opaque() else ident


def _compile_form() -> str:
    """The settings a decomposition reads beside the selection (the eager rule, and whether the
    compiled forward runs in CUDA graphs), read per trace: a compile cache keyed on the graph
    must not return code decided under other values (a persistent AOTAutograd cache outlives
    the process). Inductor's own `triton.cudagraphs` is in its cache key already."""
    from tunedb import settings

    try:
        return (f"+eager={int(settings.eager_fallback_enabled())}/{settings.eager_kernel_us()}"
                f"/graphs={int(settings.compiled_graphs_forced())}/siblings={int(settings.compiled_siblings_on())}")
    except Exception:  # noqa: BLE001 - a setting refused mid-process: never the trace's failure
        return "+eager=?"


def _opaque() -> bool:
    """Whether calls must stay per-call resolutions (never decided in a compiler's trace): an
    override serves (autotune() may measure), or a recorder or TUNEDB_CAPTURE watches calls.
    compile_token marks exactly these states, as traced() declines in exactly these."""
    return bool(_overrides or _recorders) or _capture[0] is not None


def clear() -> None:
    """Forget every bound launcher (the next call of each shape resolves again)."""
    from tunedb.database import tiers

    _table.clear()
    _forget_calls()
    _epoch[0] = _selector_epoch()
    _capture[0] = _capture_path()
    _selection_id[0] = None
    tiers.on_reload(clear)  # (once: on_reload ignores a hook it has) a new epoch clears the table


def sync() -> None:
    """Start this table's epoch now if the tiers moved on."""
    if _selector_epoch() != _epoch[0]:
        clear()


def remember(key: tuple[Any, ...], bound: Bound) -> None:
    """Let later calls with this exact key go straight to `bound` (unless something observes calls).
    Only a bound the table still holds: a reload on another thread between the call's lookup
    and this must not leave the old epoch's launcher serving the new one."""
    if _capture[0] is None and not _recorders and _table.get(bound.key) is bound:
        _calls[key] = bound


def _capture_path() -> Any:
    from tunedb import settings

    return settings.capture_path()


def _capturing() -> bool:
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def _record_capture(bound: Bound, captured: bool) -> None:
    """TUNEDB_CAPTURE: one line per new (signature, M), and one more once it runs captured."""
    from tunedb.census.capture import record_call

    record_call(bound.signature, bound.m, calls=1, captured=captured, path=_capture[0])
    bound.seen_captured = captured


def entries() -> tuple[tuple[tuple[Any, ...], Bound], ...]:
    """(key, bound) of every shape resolved in this epoch (for the tuning report); key is
    (op, torch dtype, N, K, act, has_bias, M)."""
    if _epoch[0] != _selector_epoch():
        return ()
    return tuple(_table.items())


def signature_of(op: str, x: Any, weight: Any, bias: Any, act: str) -> tuple[Signature, int]:
    return _family().signature_of(op, x, weight, bias, act=act)


def resolve(family: Any, sig: Signature, m: int) -> tuple[Config, str, Any]:
    """The overrides (innermost first), then the selector's chain: (config, tier, the counter
    this shape's calls go to)."""
    for override in reversed(_overrides):
        got = override(family, sig, m)
        if got is not None:
            return (*got, Count())
    try:
        slot = _selector().slot(family.name, sig, m)
    except SignatureError:
        # a call whose key its family cannot serve (a dtype or field no kernel of it takes): the
        # framework's op runs it, as first_call's fallback would; the selector's error is for
        # callers that ask about a key (plans, the CLI), not for a model's forward
        return Config.sentinel("torch"), "default", Count()
    return slot.resolution.config, slot.resolution.tier, slot


def launcher(op: str, x: Any, weight: Any, bias: Any, act: str, m: int) -> Bound:
    """The bound launcher for this call's shape (x is [..., K], M the product of its lead
    dims); call it as bound.call(x, weight, bias, out)."""
    key = _key(op, x, weight, bias, act, m)
    sync()
    bound = _table.get(key)
    if bound is None:
        bound = _insert(key, op, x, weight, bias, act)
        if _capture[0] is not None:
            _record_capture(bound, _capturing())
    elif _capture[0] is not None and not bound.seen_captured and _capturing():
        _record_capture(bound, True)
    bound.counter.calls += 1
    return bound


def static_shapes(x: Any, weight: Any) -> bool:
    """Whether every size of x and weight is a plain int (no SymInt: a dynamic or data-dependent
    dimension under a compiler)."""
    return all(isinstance(d, int) for d in (*x.shape, *weight.shape))


def traced(op: str, x: Any, weight: Any, bias: Any, act: str) -> "Bound | None":
    """Compile time (a compiler decomposing a tuned op, its shapes static: the caller checks
    static_shapes): the bound resolution, kept in the table as a call's would be (so the report
    and later eager calls see the same choice) but not counted as a call. None, to keep the op
    opaque and resolve it per call, when an override serves (autotune() may measure, which must
    never happen inside a compiler's trace), or a recorder or TUNEDB_CAPTURE watches calls (a
    census taken from a compiled model must still see every shape)."""
    sync()
    if _opaque():
        return None
    key = _key(op, x, weight, bias, act, x.numel() // weight.shape[1])
    return _table.get(key) or _insert(key, op, x, weight, bias, act)


def _key(op: str, x: Any, weight: Any, bias: Any, act: str, m: int) -> tuple[Any, ...]:
    """The table's key of a call: what resolution depends on (op, dtype, N, K, act, bias, M)."""
    return (op, x.dtype, weight.shape[0], weight.shape[1], act, bias is not None, m)


def _insert(key: tuple[Any, ...], op: str, x: Any, weight: Any, bias: Any, act: str) -> Bound:
    bound = _bind(op, x, weight, bias, act)
    bound.key = key
    _table[key] = bound
    return bound


def _bind(op: str, x: Any, weight: Any, bias: Any, act: str) -> Bound:
    family = _family()
    sig, m = signature_of(op, x, weight, bias, act)
    return bind(family, sig, m, _call_for)


def bind(family: Any, sig: Signature, size: int,
         make: Callable[[Any, Config, Signature], Callable[..., Any]]) -> Bound:
    """A shape's Bound: its resolution (resolve) and `make(family, config, sig)`'s launcher; where
    the family's eager_fallback hook names a sentinel, that sentinel's launcher serves the calls
    made outside CUDA-graph capture (runtime/host_bound.py). GEMM's ops and runtime.dispatch's
    families both bind here."""
    config, tier, counter = resolve(family, sig, size)
    bound = Bound(family.name, sig, size, config, tier, make(family, config, sig), counter)
    chained = capture_chain.pdl_switch(family, config, sig, make)
    if chained is not None:
        bound.call, bound.direct = chained, None
    eager = host_bound.eager_fallback(family, sig, size, config, tier)
    if eager is not None:
        from tunedb.families.contract import hook
        bound.eager = eager
        bound.call = host_bound.graph_only(bound.call, make(family, Config.sentinel(eager), sig),
                                           prime=bool(hook(family, "eager_prime")(config)))
        bound.direct = direct_of(bound.call)  # the wrapper's: None (capture must see the tuned call)
    return bound


def _call_for(family: Any, config: Config, sig: Signature) -> Callable[..., Any]:
    """A family's own cached closure is its leanest path; launch() bound here is the general one."""
    make = getattr(family, "launcher", None)
    return make(config, sig) if callable(make) else functools.partial(family.launch, config, sig)


def first_launch(bound: Bound, x: Any, weight: Any, bias: Any) -> Any:
    """A linear layer's first call through first_call (the GEMM launchers' argument order)."""
    return first_call(bound, x, weight, bias, None)


def first_call(bound: Bound, *args: Any) -> Any:
    """Run a shape's first call, `bound.call(*args)`; if its config fails to compile or launch
    (outside a capture), warn once and serve the shape with the framework's op ('torch') for the
    rest of the epoch. Any family's run-time ops share it."""
    try:
        out = bound.call(*args)
    except Exception as exc:
        if bound.config.id == "torch" or _capturing():
            raise
        import warnings

        from tunedb import families
        from tunedb.errors import TunedbWarning

        family = families.get(bound.family)
        size = getattr(getattr(family, "schema", None), "size", "M")
        warnings.warn(f"tunedb: config {bound.config.id} ({bound.tier} tier) failed on its first call "
                      f"for {bound.signature} at {size}={bound.m} ({type(exc).__name__}: {exc}); the torch "
                      f"arm serves this shape until the next epoch", TunedbWarning, stacklevel=4)
        torch_arm = Config.sentinel("torch")
        bound.call = _call_for(family, torch_arm, bound.signature)
        bound.direct = direct_of(bound.call)
        bound.config = torch_arm
        out = bound.call(*args)
    bound.launched = True
    return out


@contextlib.contextmanager
def overriding(override: Override) -> Iterator[None]:
    """Install a resolver override for the duration; the table is cleared on entry and exit, and
    the on_override hooks run on entry."""
    _overrides.append(override)
    clear()
    for hook in tuple(_override_hooks):
        hook()
    try:
        yield
    finally:
        _overrides.remove(override)
        clear()


_override_hooks: list[Callable[[], None]] = []


def on_override(hook: Callable[[], None]) -> None:
    """Call `hook` whenever an override is installed (autotune() entering: the bmm family re-arms
    the product mode of models it had stopped probing)."""
    if hook not in _override_hooks:
        _override_hooks.append(hook)


def recording_active() -> bool:
    return bool(_recorders)


_inside: list[int] = [0]  # depth of recorded tuned-op calls running now (their fallback GEMMs)


@contextlib.contextmanager
def recorded_call() -> Iterator[None]:
    """Mark the body as the implementation of a tuned-op call just recorded: a census recorder
    that also watches aten GEMMs (tunedb census --fused) skips the ones issued in here."""
    _inside[0] += 1
    try:
        yield
    finally:
        _inside[0] -= 1


def inside_recorded_call() -> bool:
    return _inside[0] > 0


def record(op: str, x: Any, weight: Any, bias: Any, act: str) -> None:
    sig, m = signature_of(op, x, weight, bias, act)
    for sink in _recorders:
        sink.append((FAMILY, sig, m))


def record_key(family: str, sig: Signature, size: int) -> None:
    """Record one tuned-op call of any family, keyed as its run time keys it (recording())."""
    for sink in _recorders:
        sink.append((family, sig, size))


@contextlib.contextmanager
def recording() -> Iterator[list[tuple[str, Signature, int]]]:
    """Collect (family, signature, M) of every tuned-op call made inside the block."""
    sink: list[tuple[str, Signature, int]] = []
    _recorders.append(sink)
    _forget_calls()  # every call must reach record() while this block runs
    try:
        yield sink
    finally:
        _recorders.remove(sink)
