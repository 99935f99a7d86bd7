"""Sibling projections in one launch: optimize()'s groups of TunedLinears that a module's code
calls on the same tensor (sibling_source.py), run at 1 to TUNEDB_SIBLING_ROWS rows (default 16) as
kernels_siblings.py's one launch.

Why: at decode batch 1 each projection is a weight stream with a fixed cost its bytes do not
pay (launch, ramp-up, tail). Measured on the H200 at M=1 (BENCHMARKS.md, session 35,
bench/siblings_gemv.py; separator after each call): Llama-3-8B q/k/v 15.4 us in one launch
against 27.0 us for three cuBLAS calls and 21.4 us for tunedb's tuned calls one by one (16.6 us
for one cuBLAS call over a concatenated copy of the weights); gate/up 55.6 against 61.8; Qwen2-7B
q/k/v with bias 10.8 against 25.4; BERT-base q/k/v 4.1 against 14.0.

How a call runs: the first member called with a CUDA tensor x of up to TUNEDB_SIBLING_ROWS rows
(default 16; past one row the kernel's tensor-core path, measured at 1.03-3.5x cuBLAS one by one
over eleven groups, session 37; outside a CUDA-graph capture one row only, with a member tunedb
serves: the eager rule, call(), whose declined calls prime the launch once, may_take()), fp16/bf16,
contiguous; every member's weight of x's dtype,
contiguous, on x's device; biases all present or all absent; no gradient, tracer, mode or autocast: TunedLinear's fast-path
conditions) computes every member's output in one launch, returns its own and keeps the others
for x. A member then called with that same tensor object, unmodified since (its version
counter), takes its kept output once, if its weight and bias are the ones the launch read,
unwritten since; any other call (another tensor, a second call, more rows, a CPU tensor) runs
the member alone as before. So a group the source rule found wrongly costs the siblings' work
once, never a wrong result. Outputs are each member's own contiguous tensor, as F.linear's. The weights are
the members' own Parameters, read at every call (no concatenated copy; `.to()` and
load_state_dict are seen). In a CUDA-graph capture the launch is captured with the first
member's call and its siblings take their outputs from it. Only on a GPU whose arch family has
a shipped profile (the rule every measured choice follows); TUNEDB_SIBLINGS=0 groups nothing.
"""
from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn

from tunedb import settings
from tunedb.families.gemm import quiet_members
from tunedb.families.gemm.fusion_source import model_outside_reads
from tunedb.families.gemm.sibling_source import sibling_calls
from tunedb.families.module_rules import holders
from tunedb.runtime import report

MAX_MEMBERS = 3  # the kernel's branches
MAX_ROWS_KERNEL = 16  # kernels_siblings.MAX_ROWS (the module imports triton: read at a launch only)


def _version(x: Any) -> int | None:
    """x's version counter; None for an inference tensor (torch.inference_mode), which keeps none:
    there the source rule's guarantee (no in-place use of the tensor between the calls) stands alone."""
    try:
        return x._version
    except RuntimeError:
        return None


def _stamp(member: Any) -> tuple[Any, ...]:
    """A member's registered weight and bias with their version counters: a kept output is the
    member's only while these are what the launch read."""
    p = member._parameters
    w, b = p.get("weight"), p.get("bias")
    return (w, None if w is None else _version(w), b, None if b is None else _version(b))


_DTYPES = (torch.float16, torch.bfloat16)
# Past K = 2048 a group of fewer weight rows than this runs alone: few programs each streaming a
# deep slab are latency-bound where cuBLAS splits K. One row: no such group measured (the
# smallest, 1536 rows at K = 1024, won 4.4x), 512 rows is 32 programs; 2-16 rows: 768 rows at
# K = 4096 won 1.9x (session 37 call 2), half that is the edge of measured support.
DEEP_K, FEW_ROWS, FEW_ROWS_MMA = 2048, 512, 384
# At 2-16 rows a group of more weight bytes runs each member alone: session 37 call 2 measured
# groups of 3-272 MB at 1.03-3.5x cuBLAS one by one (the least over the largest: one launch saves a
# few us of 60-75); twice the largest is the edge of measured support.
MMA_MAX_BYTES = 544 << 20
# Eagerly (no capture) a group with a member tunedb serves launches at one row only if its weights
# are this large: its launch costs the host more than the three calls it replaces (session 42:
# +6 us over three nn.Linear calls on a fast H100 host, +21 us on a slow one, where a served
# member's own Triton launch costs +0.8 us), so only a group whose one-row kernel saves GPU time
# a decode step waits for pays for it. Llama-3-8B's 50 MB q/k/v gained (1.15x eager decode b1,
# session 35). A tensor-parallel shard's 12.6 MB q/k/v with one served member ran 1.11-1.12x
# slower than plain eagerly at b1 with and without this rule (session 42 calls 4 and 6: the
# members' Python, not the group, set that), so the bound rests on the host costs above.
# Session 45 (H100 hosts) added a second bound: the weights' stream at the arch's DRAM bandwidth
# must take TUNEDB_EAGER_KERNEL_US (64 us) at least, the line under which a GEMM's eager calls go
# to torch (families/gemm/model.eager_fallback): an eager decode step is host-bound as a whole
# (Llama-3-8B layers at b1 eagerly: 1.11-1.14x plain's time with the groups launching, 1.04x
# with siblings off, same rounds, a noisy host), so Llama-3-8B's 50 MB q/k/v and 235 MB gate/up
# run as their members' own calls eagerly now, and a 70B-class gate/up (940 MB) still launches.
EAGER_MIN_BYTES = 32 << 20


def sizes_admit(rows: int, k: int, weights: list[Any], itemsize: int) -> bool:
    """The launch's size rules (MMA_MAX_BYTES past one row, DEEP_K over few weight rows): the
    eager group's and the compiled one's (siblings_compile.admits)."""
    if rows > 1 and sum(w.numel() for w in weights) * itemsize > MMA_MAX_BYTES:
        return False
    return not (k > DEEP_K and sum(w.shape[0] for w in weights) < (FEW_ROWS if rows == 1 else FEW_ROWS_MMA))


def _eager_stream_bytes() -> float:
    """Weight bytes whose stream takes TUNEDB_EAGER_KERNEL_US at this arch's DRAM bandwidth (0
    where no profile is shipped: no group launches there at all)."""
    from tunedb.runtime import selector

    profile = selector.current_arch()[1]
    return 0.0 if profile is None else settings.eager_kernel_us() * profile.dram_bw_gbs * 1e3


# torch.cuda.is_current_stream_capturing's own C function, one Python frame fewer: a
# left-as-written member asks it at every eager call (session 41 tried a count of torch's
# captures instead, kept by wrapping CUDAGraph's capture methods: the member's excess host time
# over nn.Linear stayed, +1.4 us a call on an H100, so torch is not patched for it)
_IS_CAPTURING = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)


def _capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (called only with CUDA tensors)."""
    return _IS_CAPTURING() if _IS_CAPTURING is not None else torch.cuda.is_current_stream_capturing()


# the raw handle of a device's current stream: 0 for the legacy default stream, where nothing is
# captured (torch refuses a capture there: "CUDA graphs must be captured on a non-default stream");
# one getter for the group and its quiet members
_RAW_STREAM = quiet_members._RAW_STREAM


def _capturing_for(x: Any) -> bool:
    """_capturing() for a call on CUDA x, with no query of the driver while x's device runs on its
    default stream (an eager model's usual case: the driver's query took 0.32 us a call against
    the stream handle's 0.08 on an H100's host, session 42 call 3)."""
    if _RAW_STREAM is not None and _RAW_STREAM(x.get_device()) == 0:
        return False
    return _capturing()


_LIVE: "weakref.WeakSet[SiblingGroup]" = weakref.WeakSet()  # the groups of models still alive: report_lines


def report_lines() -> list[str]:
    """One tuning_report() line: the live groups, their members' names, and the launches so far."""
    groups = list(_LIVE)
    if not groups:
        return []
    names = sorted({"+".join(g.names) for g in groups})
    rows = max(g.max_rows for g in groups)
    at = "one row" if rows == 1 else f"up to {rows} rows"
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    return [f"siblings: {len(groups)} group(s) of projections called on one tensor ({shown}) run as one launch "
            f"at {at}; {sum(g.launches for g in groups)} such launch(es) so far (TUNEDB_SIBLINGS=0: each alone)"]


class SiblingGroup:
    """The members (TunedLinears, in the module's attribute order) and what the last group launch
    left for the members not yet called: one state tuple (the tensor it ran on, its version, the
    outputs, each member's weight and bias as read), replaced whole, so a thread reading it sees
    one launch's outputs or none."""

    def __init__(self, members: list[Any], names: tuple[str, ...] = (), max_rows: int = 1,
                 split: bool = False) -> None:
        self.members = members
        self.names = names  # the members' attribute names (the report)
        self.max_rows = max_rows  # TUNEDB_SIBLING_ROWS when optimize() ran
        self.split = split  # TUNEDB_SIBLING_SPLIT=auto when optimize() ran: K split by the SM count
        self.launches = 0
        self._sites: dict[tuple[Any, ...], tuple[Any, Any, Any]] = {}  # shapes key -> (site, grid, workspace sizes)
        self._work: dict[tuple[Any, ...], tuple[Any, Any]] = {}  # (sizes, device) -> workspace made outside a capture
        self._primed: set[tuple[int, Any]] = set()  # (rows, dtype) launched, or declined eagerly and primed
        # (x.numel(), dtype) of eager calls on a default stream that may_take declined after their
        # priming: the members' forward answers those with two C calls (quiet()), not may_take's frames
        self.quiet: set[tuple[int, Any]] = set()
        self._state: tuple[Any, Any, list[Any], list[Any]] | None = None
        self._arch_ok: bool | None = None  # decided at the first CUDA call (configure() may pin it before)
        self._written: bool | None = None  # as_written(), kept from the first call on (refresh())
        self._eager_row: bool | None = None  # eager_one_row(), kept likewise
        _LIVE.add(self)

    def __getstate__(self) -> dict[str, Any]:  # pickle / deepcopy: members, never kept outputs or sites
        return {"members": self.members, "names": self.names, "max_rows": self.max_rows, "split": self.split}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["members"], tuple(state.get("names", ())), state.get("max_rows", 1),
                      state.get("split", False))

    def as_written(self) -> bool:
        """Every member runs as written (F.linear) when the group does not take its call. Kept
        from the first ask (members' marks are read then, never while unpickling builds them);
        optimize() calls refresh() where it unmarks a member."""
        written = self._written
        if written is None:
            written = self._written = all("_as_written" in m.__dict__ for m in self.members)
        return written

    def eager_one_row(self) -> bool:
        """Whether an eager call at one row is worth a launch: a member tunedb serves (its own call
        would be a Triton launch anyway) and EAGER_MIN_BYTES of weights at least, as many as
        stream in TUNEDB_EAGER_KERNEL_US. Kept as as_written() is."""
        take = self._eager_row
        if take is None:
            weights = [m.__dict__.get("_parameters", {}).get("weight") for m in self.members]
            size = sum(w.numel() * w.element_size() for w in weights if isinstance(w, torch.Tensor))
            take = self._eager_row = (not self.as_written() and size >= EAGER_MIN_BYTES
                                      and size >= _eager_stream_bytes())
        return take

    def refresh(self) -> None:
        """A member's mark changed (optimize() re-run after a tune serves it now)."""
        self._written = self._eager_row = None
        self.quiet = set()
        quiet_members.leave(self.members)

    def may_take(self, x: Any) -> bool:
        """Whether a launch for CUDA x is worth making: 1 to max_rows rows, and outside a CUDA-graph
        capture the eager rule (call()). The one check of rows and capture: call() asks it before
        a launch, a left-as-written member before it looks at the group at all. Where the eager
        rule alone declines, the first such call of each row count primes the launch (_prime)."""
        shape = x.shape
        k = shape[-1] if shape else 0
        rows = x.numel()
        if not 0 < rows <= k * self.max_rows:
            return False
        if _capturing_for(x) or (rows == k and self.eager_one_row()):
            return True
        if (rows // k, x.dtype) not in self._primed:
            self._prime(x)
        elif _RAW_STREAM is not None and _RAW_STREAM(x.get_device()) == 0:
            self.quiet.add((rows, x.dtype))  # declined again, primed, on a stream nothing captures
        return False

    def prime_forms(self) -> None:
        """Prime the kernel's specialisations this group has not run (one row, a few, sixteen: MP
        and Triton's M == 1 / M % 16 keys; every other row count shares one of those binaries and
        the workspace), on the current stream, before a capture begins (quiet_members: members that
        answered their eager calls themselves never primed the rows the capture may call with)."""
        w = self.members[0].__dict__.get("_parameters", {}).get("weight")
        if self._arch_ok is False or not isinstance(w, torch.Tensor) or w.dtype not in _DTYPES or not w.is_cuda:
            return
        for rows in (1, 2, MAX_ROWS_KERNEL):
            if rows <= self.max_rows and (rows, w.dtype) not in self._primed:
                self._prime(torch.zeros(rows, w.shape[1], dtype=w.dtype, device=w.device))

    def _prime(self, x: Any) -> None:
        """Launch once for an eager call the eager rule declines (the outputs dropped), so that a
        capture after an eager warm-up finds the kernel loaded and its workspace made: a first
        launch inside a capture loads the module there, which CUDA may refuse ("operation not
        permitted when stream is capturing"), and allocates there (fill kernels in the graph at
        every replay). Once per (rows, dtype); a launch that fails turns the group off (each
        member alone) with a warning, as it would fail inside the capture too."""
        self._primed.add((x.numel() // x.shape[-1], x.dtype))
        weights, biases, _stamps = self._operands(x)
        if weights is None:
            return
        try:
            self._launch(x, weights, biases)
        except Exception as exc:  # noqa: BLE001 - a kernel that cannot run: the members run alone
            import warnings

            from tunedb.errors import TunedbWarning

            self._arch_ok = False
            warnings.warn(f"tunedb: the sibling launch of {'+'.join(self.names) or 'a group'} failed "
                          f"({type(exc).__name__}: {exc}); its members run alone", TunedbWarning, stacklevel=4)

    def call(self, index: int, x: Any) -> Any:
        """Member `index`'s output for x from the group, or None: the member runs alone.

        Eager rule: outside a CUDA-graph capture a group launches only at one row with a member
        tunedb serves and EAGER_MIN_BYTES of weights (eager_one_row). Eagerly the host sets the
        pace and one Triton launch costs more host time than the cuBLAS calls it replaces
        (session 37 call 3: a decoder no table names, its q/k/v and gate/up left as written,
        grouped eagerly at 1 and 16 rows 1.17-1.18x slower than plain, in graphs 1.18-1.20x
        faster; session 42 call 2 again 1.21-1.26x); at one row with served members (Triton
        launches of their own) it gained 1.15x (Llama-3-8B, session 35)."""
        state = self._state
        if state is not None and state[0] is x and state[1] == _version(x):
            kept = state[2]
            y = kept[index]
            if y is not None:
                kept[index] = None
                if not any(v is not None for v in kept):
                    self._state = None
                now, then = _stamp(self.members[index]), state[3][index]
                if now[0] is then[0] and now[1] == then[1] and now[2] is then[2] and now[3] == then[3]:
                    return y
                return None  # its weight or bias was replaced or written in place since the launch
        if not self.may_take(x):
            return None
        weights, biases, stamps = self._operands(x)
        if weights is None:
            return None
        outs = self._launch(x, weights, biases)
        self.launches += 1
        kept = list(outs)
        kept[index] = None
        self._state = (x, _version(x), kept, stamps)
        return outs[index]

    def _launch(self, x: Any, weights: list[Any], biases: list[Any]) -> list[Any]:
        """One group launch for x; each member's output (x's leading shape)."""
        from tunedb.families.gemm import kernels_siblings

        k = x.shape[-1]
        # one a row count (the shapes change with the rows) and device (the workspace lives on one)
        key = (tuple(w.shape[0] for w in weights), k, biases[0] is not None, x.numel() // k, x.get_device())
        got = self._sites.get(key)
        if got is None:
            # the members' fused activations are fixed at their swap (read here, not in __init__: an
            # unpickled group's members are not restored yet when it is)
            acts = tuple(m.act for m in self.members)
            sms = torch.cuda.get_device_properties(x.device).multi_processor_count if self.split else 0
            tiles = kernels_siblings.tile(k, key[3], sum(key[0]), sms)
            site, grid = kernels_siblings.site_for(key[0], k, key[2], acts, False, tiles, key[3])
            got = self._sites[key] = (site, grid, kernels_siblings.workspace_sizes(key[0], k, key[3], tiles))
        site, grid, sizes = got
        work = self._work.get((sizes, key[4]))
        if work is None:
            work = self._workspace(sizes, x)
        outs = [torch.empty(*x.shape[:-1], w.shape[0], device=x.device, dtype=x.dtype) for w in weights]
        site(grid, *kernels_siblings.varying(x.view(-1), weights, biases, [o.view(-1) for o in outs], work))
        if (key[3], x.dtype) not in self._primed and not _capturing_for(x):
            self._primed.add((key[3], x.dtype))  # launched outside a capture: nothing left to prime
        return outs

    def _workspace(self, sizes: tuple[int, int], x: Any) -> tuple[Any, Any]:
        """The split-K workspace and counters of `sizes` on x's device, zeroed (each launch leaves them
        zero), shared by the group's row counts; unsplit ((1, 1): never read) empty, so no fill
        kernel. One made inside a capture is zeroed only when that graph replays: it stays that
        graph's (kept nowhere), and the next call outside a capture makes the group's own."""
        make = torch.zeros if sizes != (1, 1) else torch.empty
        work = (make(sizes[0], device=x.device, dtype=torch.float32), make(sizes[1], device=x.device, dtype=torch.int32))
        if not _capturing_for(x):
            self._work[(sizes, x.get_device())] = work
        return work

    def _operands(self, x: Any) -> tuple[list[Any] | None, list[Any], list[Any]]:
        """(weights, biases, each member's _stamp) of a launch for x, or (None, [], [])."""
        k = x.shape[-1]  # 1 to max_rows rows of it: may_take
        if x.dtype not in _DTYPES or not x.is_contiguous():
            return None, [], []
        weights, biases, stamps = [], [], []
        for m in self.members:
            p = m._parameters
            w = p["weight"] if "weight" in p else m.weight
            b = p["bias"] if "bias" in p else m.bias
            if (type(w) not in (torch.Tensor, nn.Parameter) or w.dim() != 2 or w.shape[1] != k or w.dtype != x.dtype
                    or w.device != x.device or not w.is_contiguous()):
                return None, [], []
            if b is not None and (b.dtype != x.dtype or b.device != x.device or not b.is_contiguous() or b.dim() != 1):
                return None, [], []
            weights.append(w)
            biases.append(b)
            # what _stamp(m) reads, from the lookups just made: the registered weight and bias only
            wr, br = (w if "weight" in p else None), (b if "bias" in p else None)
            stamps.append((wr, None if wr is None else _version(wr), br, None if br is None else _version(br)))
        if len({b is None for b in biases}) != 1:
            return None, [], []
        if not sizes_admit(x.numel() // k, k, weights, x.element_size()):
            return None, [], []
        # the calling member checked its own operands for a wanted gradient, not its siblings'
        # (q frozen, k trained): a sibling's gradient would be lost in the one launch
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (*weights, *biases)):
            return None, [], []
        if self._arch_ok is None:
            from tunedb.runtime import selector

            self._arch_ok = selector.current_arch()[1] is not None
        return (weights, biases, stamps) if self._arch_ok else (None, [], [])


def attach(model: nn.Module, tuned_cls: type, swappable: Any) -> int:
    """Group the sibling projections of every module of `model` (sibling_source's rule; each member
    a `tuned_cls` (its fused activation kept) or a plain nn.Linear that `swappable(linear)` admits
    and optimize() left as written, held in one place, read by no other module's code, of one
    in_features and weight dtype, biases all present or all absent); returns how many groups were
    made. A plain member becomes a `tuned_cls` marked `_as_written`: a call the group does not take
    runs F.linear as the Linear did. Members already grouped (optimize() run again) stay."""
    if not settings.siblings_enabled():
        return 0
    max_rows, split = settings.sibling_rows(), settings.sibling_split_auto()
    held = holders(model)
    outside: list[frozenset[str] | None] = []  # read at the first candidate group (parses the model's sources)
    made = 0
    for parent in list(model.modules()):
        if type(parent) is nn.Sequential or "forward" in vars(parent) or parent._forward_hooks or parent._forward_pre_hooks:
            continue
        if sum(type(c) in (tuned_cls, nn.Linear) for c in parent._modules.values()) < 2:
            continue
        for names in sibling_calls(type(parent)):
            if not outside:
                outside.append(model_outside_reads(model))
            if outside[0] is None:
                return made  # some model code unreadable: nothing is proven safe
            members = [parent._modules.get(n) for n in names]
            if not _groupable(members, names, tuned_cls, swappable, held, outside[0]):
                continue
            for i, (n, m) in enumerate(zip(names, members)):
                if type(m) is nn.Linear:
                    members[i] = tuned_cls(m)
                    members[i].__dict__["_as_written"] = True
                    if report.LEFT_MARK in m.__dict__:  # still left as written: prewarm / autotune() measure it
                        members[i].__dict__[report.LEFT_MARK] = m.__dict__[report.LEFT_MARK]
                    setattr(parent, n, members[i])
            group = SiblingGroup(members, tuple(names), max_rows, split)
            for i, m in enumerate(members):
                m.__dict__["_siblings"] = (group, i)
            made += 1
    return made


def _groupable(members: list[Any], names: tuple[str, ...], tuned_cls: type, swappable: Any,
               held: dict[int, int], outside: frozenset[str]) -> bool:
    if len(members) > MAX_MEMBERS or any(n in outside for n in names):
        return False
    for m in members:
        if type(m) is tuned_cls:
            if "_siblings" in m.__dict__:
                return False
        elif type(m) is not nn.Linear or not swappable(m):
            return False
        if held.get(id(m)) != 1:
            return False
    ws = [m.weight for m in members]
    return (all(isinstance(w, torch.Tensor) and w.dim() == 2 for w in ws) and len({w.shape[1] for w in ws}) == 1
            and len({w.dtype for w in ws}) == 1 and len({m.bias is None for m in members}) == 1)
