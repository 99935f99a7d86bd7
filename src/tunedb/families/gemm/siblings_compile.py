"""Sibling groups in compiled code: optimize()'s groups of projections called on one tensor
(siblings.py) run as one launch inside a compiled forward that runs in CUDA graphs.

Eagerly a group's first member launches for all and keeps the others' outputs (host state that
Dynamo cannot trace: session 46's graph breaks), so a compiled model ran each member alone --
in Llama-3-8B decode in graphs that is 0.937x plain's time where the groups give 0.887x (session
46, H100, `tp_shard_decode.py --tp 1`). Here a member traced by a compiler becomes
``tunedb::sibling(x, the group's weights, biases, acts, written, index)``: the member's own output,
pure, so the graph stays functional and Dynamo needs no state. Then:

- where the compiled forward runs without CUDA graphs, or the group's launch does not admit the
  traced shapes (more rows than the kernel takes, fp32, a deep K over few rows...), the op
  decomposes into the member's own form (its tuned op, or F.linear for a member left as
  written): what compiling a model without groups gives;
- otherwise it stays, and a post-grad pass of Inductor's (GroupPass, installed by the first
  decomposition that keeps a member, where the user has no pass of their own there) replaces the members of one group called on one tensor by one
  ``tunedb::siblings`` node (the launch) and getitems of it. A member whose siblings the graph
  does not call with the same tensor stays a ``tunedb::sibling`` node, which runs that member
  alone: a pass that does not run (a user's config replaced it) costs no extra work.

The pass touches no other node, so the compiles of other models in the process are unchanged
(its uuid enters Inductor's cache key). TUNEDB_SIBLINGS=0 makes no groups at all.

On by default since session 48 (TUNEDB_COMPILED_SIBLINGS; H100, bench/compile_nograph.py --mode
reduce-overhead, Llama-3-8B layers: 10% / 6% less GPU time than compile alone at b1 / b16, the
same Python calls per forward; the host-bound wall ratio spread 0.88-1.07 over five runs; its GPU
tests, tests/gpu/test_siblings_compile_gpu.py, passed).
With it off a member's trace reads no other member (a trace constant: member_call returns at
once) and compiles to what it compiled to before session 47.
"""
from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F

from tunedb import settings
from tunedb.families.gemm import ops, siblings

_lib = torch.library.Library("tunedb", "FRAGMENT")  # noqa: TOR901 - kept alive for the process
_lib.define("sibling(Tensor x, Tensor[] weights, Tensor?[] biases, str[] acts, bool[] written, int index, "
            "bool split=False, str tiers='') -> Tensor")
_lib.define("siblings(Tensor x, Tensor[] weights, Tensor?[] biases, str[] acts, bool split=False) -> Tensor[]")


_OBJECTS_CONSTANT: list[bool] = []


def objects_constant() -> bool:
    """Whether this torch's Dynamo calls a function marked constant with an object argument (torch
    2.13: the object identity-guarded), which _spec takes. torch 2.11 refuses it
    (InternalTorchDynamoError: "UserDefinedObjectVariable(...) is not a constant", every compile of
    a model with a sibling group: H100, session 50); there the trace reads what it reads itself
    (more guards, the same graph). Itself a trace constant of no argument."""
    if not _OBJECTS_CONSTANT:
        try:
            import inspect

            from torch._dynamo.variables import functions

            src = inspect.getsource(functions.invoke_and_store_as_constant)
            _OBJECTS_CONSTANT.append("UserDefinedObjectVariable" in src)
        except Exception:  # noqa: BLE001 - internals of Dynamo: unknown, the safe form
            _OBJECTS_CONSTANT.append(False)
    return _OBJECTS_CONSTANT[0]


objects_constant._dynamo_marked_constant = True  # type: ignore[attr-defined]


def _opted_in() -> bool:
    return settings.compiled_siblings_on()


# read by Dynamo at trace time as a constant (ops._token's mark): off, a member's trace returns
# here and reads no other member (no guard on their weights), compiling to what it did before
_opted_in._dynamo_marked_constant = True  # type: ignore[attr-defined]


def _backend_graphs() -> bool | None:
    """Whether the backend of the trace under way records CUDA graphs: Inductor with
    triton.cudagraphs (mode="reduce-overhead" sets it in the backend's own options, which Inductor
    applies only when it compiles, after the trace), read off Dynamo's compiler at trace time; None
    where it cannot tell (another backend, a torch whose internals differ)."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        fn = InstructionTranslator.current_tx().output.compiler_fn
        for _ in range(8):  # Dynamo's debug wrapper(s) around the backend
            if type(fn).__name__ == "_TorchCompileInductorWrapper" and isinstance(getattr(fn, "config", None), dict):
                from torch._inductor import config as inductor_config

                return bool(fn.config.get("triton.cudagraphs", inductor_config.triton.cudagraphs))
            fn = getattr(fn, "_torchdynamo_orig_backend", None) or getattr(fn, "compiler_fn", None)
            if fn is None:
                return None
    except Exception:  # noqa: BLE001 - internals of Dynamo: unknown, the members are read
        return None
    return None


def _may_group() -> bool:
    """Whether a member's trace reads its group at all: opted in, and a compile whose forward may
    run in CUDA graphs (the decomposition keeps the group only there, `_kept`). Without graphs the
    member's own form is what the graph gets anyway, and reading every member's weights from every
    member's trace cost guards at each compiled call (9 member reads for q/k/v)."""
    if not _opted_in():
        return False
    return settings.compiled_graphs_forced() or _backend_graphs() is not False


_may_group._dynamo_marked_constant = True  # type: ignore[attr-defined]  # a trace's constant


def member_call(layer: Any, x: Any) -> Any:
    """While a compiler traces: member `layer`'s output as a ``tunedb::sibling`` op, or None (the
    member's own path): x on CUDA in a dtype the kernel takes, 1 to the group's rows, no gradient
    wanted, no autocast or functorch transform, every member's weight registered; TUNEDB_COMPILED_SIBLINGS on."""
    if not _may_group():
        return None
    group, index = layer.__dict__["_siblings"]
    if not isinstance(x, torch.Tensor) or not x.is_cuda or x.dtype not in siblings._DTYPES or x.dim() == 0:
        return None
    k = x.shape[-1]
    if k == 0 or not 0 < x.numel() <= k * group.max_rows:
        return None
    acts, written = _spec(group) if objects_constant() else _spec_read(group)
    weights, biases = [], []
    for m in group.members:
        p = m._parameters
        if "weight" not in p or p["weight"] is None:
            return None
        weights.append(p["weight"])
        biases.append(p.get("bias"))
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, *weights, *biases)):
        return None
    if ops._autocast() or ops._transformed():  # the member's own path casts (ops_autocast) or runs torch's form
        return None
    return torch.ops.tunedb.sibling(x, weights, biases, acts, written, index, group.split, ops._token())


def _spec(group: Any) -> tuple[list[str], list[bool]]:
    """The members' activations and left-as-written flags, which a trace takes as constants (each
    member's own trace guards its `act`): read member by member in every member's trace, they were
    two to three guards a member per member, checked at every compiled call."""
    return [m.act for m in group.members], ["_as_written" in m.__dict__ for m in group.members]


_spec._dynamo_marked_constant = True  # type: ignore[attr-defined]  # assume_constant_result's mark


def _spec_read(group: Any) -> tuple[list[str], list[bool]]:
    """_spec, traced (a torch whose Dynamo refuses an object argument to a constant: objects_constant)."""
    return [m.act for m in group.members], ["_as_written" in m.__dict__ for m in group.members]


def _check_member(x: Any, weights: list[Any], biases: list[Any], acts: list[str], written: list[bool],
                  index: int) -> None:
    if not 0 <= index < len(weights) or not len(weights) == len(biases) == len(acts) == len(written):
        raise ValueError(f"tunedb::sibling: index {index} of {len(weights)} weights, {len(biases)} biases, "
                         f"{len(acts)} acts, {len(written)} written flags (one each per member)")
    ops._check(x, weights[index], biases[index], acts[index])


def _member(x: Any, weights: list[Any], biases: list[Any], acts: list[str], written: list[bool],
            index: int, tiers: str) -> Any:
    """Member `index` alone: F.linear for one left as written, else its tuned op."""
    _check_member(x, weights, biases, acts, written, index)
    w, b, act = weights[index], biases[index], acts[index]
    if written[index]:
        return ops.ACTS[act](F.linear(x, w, b))
    if b is None and act == "none":
        return torch.ops.tunedb.gemm(x, w, tiers)
    return torch.ops.tunedb.gemm_act(x, w, b, act, tiers)


def _sibling_impl(x: Any, weights: list[Any], biases: list[Any], acts: list[str], written: list[bool],
                  index: int, split: bool = False, tiers: str = "") -> Any:
    return _member(x, weights, biases, acts, written, index, tiers)


def admits(x: Any, weights: list[Any], biases: list[Any], acts: list[str]) -> bool:
    """Whether one launch of kernels_siblings takes these operands (real or fake tensors): the
    checks of SiblingGroup._operands and may_take (capture assumed), on a GPU with a shipped profile."""
    k = x.shape[-1] if x.dim() else 0
    rows = x.numel() // k if k else 0
    if not (x.is_cuda and x.dtype in siblings._DTYPES and x.is_contiguous() and 0 < rows <= siblings.MAX_ROWS_KERNEL
            and 2 <= len(weights) <= siblings.MAX_MEMBERS and settings.siblings_enabled()):
        return False
    from tunedb.families.gemm.kernels_common import ACT_CODES

    if any(a not in ACT_CODES for a in acts) or len({b is None for b in biases}) != 1:
        return False
    for w, b in zip(weights, biases):
        if w.dim() != 2 or w.shape[1] != k or w.dtype != x.dtype or w.device != x.device or not w.is_contiguous():
            return False
        if b is not None and (b.dim() != 1 or b.shape[0] != w.shape[0] or b.dtype != x.dtype or not b.is_contiguous()):
            return False
    if not siblings.sizes_admit(rows, k, weights, x.element_size()):
        return False
    from tunedb.runtime import selector

    return selector.current_arch()[1] is not None


def _siblings_impl(x: Any, weights: list[Any], biases: list[Any], acts: list[str], split: bool = False) -> list[Any]:
    if not admits(x, weights, biases, acts):
        return [ops.ACTS[a](F.linear(x, w, b)) for w, b, a in zip(weights, biases, acts)]
    from tunedb.families.gemm import kernels_siblings

    k = x.shape[-1]
    m = x.numel() // k
    ns = tuple(w.shape[0] for w in weights)
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if split else 0  # the group's, at optimize()
    tiles = kernels_siblings.tile(k, m, sum(ns), sms)
    sizes = kernels_siblings.workspace_sizes(ns, k, m, tiles)
    # made per call, never kept: Inductor's CUDA-graph trees run their warm-up on a side stream
    # allocating into the graph's pool, where a kept tensor fails the pool's check (and could be
    # overwritten when the tree restores a checkpoint), and one kept tensor shared by groups replayed
    # on two streams would race. Unsplit ((1, 1): never read) costs no kernel; a split workspace
    # costs a fill (a memset node in a graph) where the eager group keeps its own zeroed one
    make = torch.zeros if sizes != (1, 1) else torch.empty
    work = (make(sizes[0], device=x.device, dtype=torch.float32), make(sizes[1], device=x.device, dtype=torch.int32))
    outs = [x.new_empty((*x.shape[:-1], n)) for n in ns]
    kernels_siblings.launch(x, weights, biases, outs, tuple(acts), tiles=tiles, workspace=work)
    return outs


_lib.impl("sibling", _sibling_impl, "CompositeExplicitAutograd")
_lib.impl("siblings", _siblings_impl, "CompositeExplicitAutograd")


@torch.library.register_fake("tunedb::sibling", lib=_lib)
def _sibling_fake(x: Any, weights: list[Any], biases: list[Any], acts: list[str], written: list[bool],
                  index: int, split: bool = False, tiers: str = "") -> Any:
    _check_member(x, weights, biases, acts, written, index)
    if x.device.type != "meta":
        from tunedb.families.gemm import ops_compile

        if not ops_compile.registered[0]:
            ops_compile.register_compile_decompositions()
    return x.new_empty((*x.shape[:-1], weights[index].shape[0]))


@torch.library.register_fake("tunedb::siblings", lib=_lib)
def _siblings_fake(x: Any, weights: list[Any], biases: list[Any], acts: list[str], split: bool = False) -> list[Any]:
    return [x.new_empty((*x.shape[:-1], w.shape[0])) for w in weights]


def decomposition(x: Any, weights: list[Any], biases: list[Any], acts: list[str], written: list[bool],
                  index: int, split: bool = False, tiers: str = "") -> Any:
    """Inductor's decomposition of ``tunedb::sibling``: kept (NotImplemented) for GroupPass where
    the compiled forward runs in CUDA graphs and one launch takes the group; the member's own form
    otherwise (decomposed in turn by its tuned op's rule)."""
    if _kept(x, weights, biases, acts) and install_pass():  # the pass groups the kept members
        return NotImplemented
    return _member(x, weights, biases, acts, written, index, tiers)


def _kept(x: Any, weights: list[Any], biases: list[Any], acts: list[str]) -> bool:
    from tunedb.families.gemm import ops_compile

    return settings.compiled_siblings_on() and ops_compile._compiler_captures() and admits(x, weights, biases, acts)


def group(graph: torch.fx.Graph) -> int:
    """Replace each set of ``tunedb::sibling`` nodes of one group on one tensor (same x, weights,
    biases, acts; two indices or more) by one ``tunedb::siblings`` node and getitems of it;
    returns how many launches were made."""
    sibling = torch.ops.tunedb.sibling.default
    found: dict[tuple[Any, ...], list[Any]] = {}
    for node in graph.nodes:
        if node.op == "call_function" and node.target is sibling:
            x, weights, biases, acts = node.args[:4]
            key = (x, tuple(weights), tuple(biases), tuple(acts))
            found.setdefault(key, []).append(node)
    made = 0
    for (x, weights, biases, acts), nodes in found.items():
        if len({n.args[5] for n in nodes}) < 2:
            continue  # one member called on this tensor: it runs alone
        vals = [n.meta.get("val") for n in nodes]
        wvals = [w.meta.get("val") if hasattr(w, "meta") else None for w in weights]
        outs: list[Any] = [None] * len(weights)
        for n, v in zip(nodes, vals):
            outs[n.args[5]] = v
        xv = x.meta.get("val") if hasattr(x, "meta") else None
        if xv is None or any(v is None for v in (*vals, *wvals)):
            continue  # no fake values to type the new node with: leave the members as they are
        for i, w in enumerate(weights):
            if outs[i] is None:
                outs[i] = xv.new_empty((*xv.shape[:-1], wvals[i].shape[0]))
        with graph.inserting_before(nodes[0]):
            split = bool(nodes[0].args[6]) if len(nodes[0].args) > 6 else bool(nodes[0].kwargs.get("split", False))
            launch = graph.call_function(torch.ops.tunedb.siblings.default,
                                         (x, list(weights), list(biases), list(acts), split))
            launch.meta["val"] = outs
        for n in nodes:
            with graph.inserting_before(n):
                item = graph.call_function(operator.getitem, (launch, n.args[5]))
                item.meta["val"] = n.meta["val"]
            n.replace_all_uses_with(item)
            graph.erase_node(n)
        made += 1
    return made


def _pass_base() -> type:
    try:
        from torch._inductor.custom_graph_pass import CustomGraphPass
    except Exception:  # noqa: BLE001 - an Inductor without it: a plain class (Inductor then skips its cache)
        return object
    return CustomGraphPass


class GroupPass(_pass_base()):  # type: ignore[misc]
    """Inductor's post_grad_custom_pre_pass: group() over the graph."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        group(graph)

    def uuid(self) -> Any:
        """A hash of the code whose choices a compiled graph keeps: this module, the launch's checks
        (siblings.py), the decompositions (ops_compile.py) and the kernel."""
        try:
            from pathlib import Path

            from torch._inductor.custom_graph_pass import get_hash_for_files

            here = Path(__file__)
            files = (here, here.with_name("siblings.py"), here.with_name("ops_compile.py"),
                     here.with_name("kernels_siblings.py"))
            return get_hash_for_files(tuple(str(f) for f in files)).hex()
        except Exception:  # noqa: BLE001 - no hash: no cache entry, never a failed compile
            return None


def install_pass() -> bool:
    """Put GroupPass in Inductor's post_grad_custom_pre_pass, called by a decomposition that keeps
    a member op (so never without TUNEDB_COMPILED_SIBLINGS=1); True where it is there. A pass the
    user put there (a callable, a list, an inference-aware pass) is left alone and False returned:
    the members then decompose to their own forms, as without the setting."""
    try:
        from torch._inductor import config as inductor_config
    except Exception:  # noqa: BLE001
        return False
    if not hasattr(inductor_config, "post_grad_custom_pre_pass"):
        return False
    current = inductor_config.post_grad_custom_pre_pass
    if current is None:
        inductor_config.post_grad_custom_pre_pass = current = GroupPass()
    return isinstance(current, GroupPass)
