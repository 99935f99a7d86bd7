"""MoE blocks of transformers models: recognise them (census) and swap their experts (optimize).

transformers 5.x keeps a MoE layer's experts as one module with stacked weights
`gate_up_proj [E, 2I, H]` (gate rows first, then up) and `down_proj [E, H, I]`, an `act_fn`,
and `forward(hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k]) -> [T, H]`
(MixtralExperts, Qwen2MoeExperts, Qwen3MoeExperts, DeepseekV3Experts, ...). The router (the
block's `gate`) and any shared expert stay the model's; only the experts' forward is replaced by
two calls of the tunedb::group_gemm op (ops.py):

    h = group_gemm(x [T, H], gate_up_proj, ids)            key (E, 2I, H, k, x=token)
    a = act(h[..., :I]) * h[..., I:]                        [T, k, I]
    y = group_gemm(a, down_proj, ids, weights)             key (E, H, I, k, x=slot)
    out = y.sum(1)                                          [T, H]

Layouts this does not recognise (transposed or biased experts, gpt-oss; transformers 4.x's
ModuleList of per-expert Linears; experts with their own _apply_gate or a post-expert norm; a
user's class that only names its weights like transformers') are left alone: they run as the
model wrote them.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Iterable

from tunedb.families.group_gemm.keys import DTYPE_NAMES, make_signature
from tunedb.records import Point, ShapeSet, Signature

# name -> (transformers config class, overrides): full-size MoE shapes for censuses and benches
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "mixtral-8x7b": ("MixtralConfig", dict(hidden_size=4096, intermediate_size=14336, num_local_experts=8,
                                           num_experts_per_tok=2, num_attention_heads=32, num_key_value_heads=8)),
    "qwen1.5-moe-a2.7b": ("Qwen2MoeConfig", dict(hidden_size=2048, moe_intermediate_size=1408, num_experts=60,
                                                 num_experts_per_tok=4, shared_expert_intermediate_size=5632,
                                                 num_attention_heads=16, num_key_value_heads=16)),
    "qwen3-30b-a3b": ("Qwen3MoeConfig", dict(hidden_size=2048, moe_intermediate_size=768, num_experts=128,
                                             num_experts_per_tok=8, num_attention_heads=32, num_key_value_heads=4)),
}


@dataclass(frozen=True)
class ExpertsInfo:
    """One recognised experts module: its place in the model and its two GEMM keys."""

    name: str
    experts: int
    hidden: int
    intermediate: int
    top_k: int
    dt: str

    def signatures(self) -> tuple[Signature, Signature]:
        up = make_signature(self.experts, 2 * self.intermediate, self.hidden, self.top_k, self.dt, "token")
        down = make_signature(self.experts, self.hidden, self.intermediate, self.top_k, self.dt, "slot")
        return up, down


def _top_k(module: Any, parent: Any) -> int | None:
    for owner in (parent, getattr(parent, "gate", None), module):
        k = getattr(owner, "top_k", None)
        if isinstance(k, int) and k > 0:
            return k
    config = getattr(module, "config", None)
    k = getattr(config, "num_experts_per_tok", None)
    return k if isinstance(k, int) and k > 0 else None


def _generic_forward(module: Any) -> bool:
    """Whether `module` computes transformers' generic experts forward, the one tuned_forward
    replaces it with: its class's forward is transformers' own (not a user's class or subclass
    that merely names its weights gate_up_proj / down_proj / act_fn: a whole MoE block taking
    forward(x) crashed on the swap, up-then-gate rows or per-expert biases were silently dropped,
    s41 audit), not replaced on the instance, and its gate is the decorator's default
    act(gate) * up (DeepSeek-V4, Step3p7, GLM-5-Next, MiniMax-M3 clamp or reshape it in their own
    _apply_gate, which the swap dropped)."""
    cls = type(module)
    if not str(getattr(cls.forward, "__module__", "")).startswith("transformers."):
        return False
    if "forward" in vars(module) and not getattr(module, "_tunedb_group_gemm", False):
        return False
    gate = getattr(cls, "_apply_gate", None)
    if gate is None:
        return True
    # the generic gate lives with the experts decorator (transformers.integrations; named
    # _default_apply_gate in 5.25), a model's own override in its modeling file
    where = str(getattr(gate, "__module__", ""))
    return where.startswith("transformers.integrations.") or (
        getattr(gate, "__name__", "") == "_default_apply_gate" and where.startswith("transformers."))


def recognise(module: Any, parent: Any = None, dt: str | None = None) -> tuple[int, int, int, int, str] | None:
    """(E, H, I, top_k, dt) when `module` is a stacked-weight experts module this family serves.
    Experts whose weights are neither bf16 nor fp16 (a model still in fp32) are not served: None,
    unless `dt` names the dtype to key them as (a census of a meta model built in fp32)."""
    gu, dp = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if gu is None or dp is None or not hasattr(module, "act_fn"):
        return None
    if getattr(module, "is_transposed", False) or getattr(module, "has_bias", False) \
            or not getattr(module, "has_gate", True) or not getattr(module, "is_concatenated", True) \
            or getattr(module, "has_post_expert_norm", False) or not _generic_forward(module):
        return None
    if len(getattr(gu, "shape", ())) != 3 or len(getattr(dp, "shape", ())) != 3:
        return None
    e, two_i, h = (int(d) for d in gu.shape)
    if two_i % 2 or tuple(int(d) for d in dp.shape) != (e, h, two_i // 2):
        return None
    k = _top_k(module, parent)
    if k is None or k > e:
        return None
    dt = dt or DTYPE_NAMES.get(str(getattr(gu, "dtype", None)))
    if dt is None or DTYPE_NAMES.get(str(getattr(dp, "dtype", None)), dt) != dt:
        return None  # fp32 (or mixed) experts run as the model wrote them
    return e, h, two_i // 2, k, dt


def find_experts(model: Any, dt: str | None = None) -> list[ExpertsInfo]:
    """Every experts module of `model` the family serves (works on meta tensors)."""
    found = []
    for parent_name, parent in model.named_modules():
        for child_name, child in parent.named_children():
            got = recognise(child, parent, dt)
            if got is not None:
                name = f"{parent_name}.{child_name}" if parent_name else child_name
                found.append(ExpertsInfo(name, *got))
    return found


def census(model: Any, tokens: Iterable[int], dt: str | None = None, workload: str = "") -> ShapeSet:
    """The group_gemm points of `model` at each token count (each experts module calls both keys
    once per forward; calls add up over layers). dt: the served dtype when the model's weights
    are not bf16/fp16 (a meta model built in fp32)."""
    calls: dict[tuple[Signature, int], int] = {}
    for info in find_experts(model, dt):
        for sig in info.signatures():
            for m in tokens:
                calls[(sig, int(m))] = calls.get((sig, int(m)), 0) + 1
    points = tuple(Point(sig, m, weight=float(c), calls=c) for (sig, m), c in sorted(calls.items()))
    return ShapeSet(points, workload=workload or type(model).__name__)


def meta_model(preset: str, layers: int = 2) -> Any:
    """A transformers model of `preset`'s shapes on meta tensors (bf16); ImportError when
    transformers (5.x: stacked experts) is not installed."""
    import torch
    import transformers

    cls_name, overrides = PRESETS[preset]
    config = getattr(transformers, cls_name)(num_hidden_layers=layers, vocab_size=1024, **overrides)
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)


def tuned_forward(self: Any, hidden_states: Any, top_k_index: Any, top_k_weights: Any) -> Any:
    """The experts' forward through two group_gemm calls (see the module docstring)."""
    from tunedb.families.group_gemm.ops import group_gemm, run as dispatch_call
    from tunedb.runtime import autocast_rule, grad_form

    dts = {str(t.dtype) for t in (hidden_states, self.gate_up_proj, self.down_proj)}
    if len(dts) != 1 or not all(d in DTYPE_NAMES for d in dts):  # (dynamo cannot compare a set with dict keys)
        # cast after the swap (model.float()) or mixed operands: not a group_gemm key; the
        # model's own forward serves, as for experts never recognised
        return type(self).forward(self, hidden_states, top_k_index, top_k_weights)
    if grad_form.wants_grad((hidden_states, top_k_weights, self.gate_up_proj, self.down_proj)) \
            or hidden_states.numel() == 0 or getattr(self, "_is_expert_parallel", False) \
            or autocast_rule.casts(hidden_states.device.type, hidden_states, self.gate_up_proj, self.down_proj) \
            or _watched(self.act_fn):
        # a training step: the Triton arm has no backward (the experts and the router would get
        # no gradient); no token: no group_gemm key; expert parallelism (transformers'
        # distributed/expert_parallel.py) routes non-local slots to the sentinel id E, which the
        # model's forward skips and group_gemm refuses (s41 audit); autocast to another dtype: the
        # model's F.linear calls run in the autocast dtype, group_gemm would keep the experts' (an
        # fp16 model under bf16 autocast differed from plain by 1e-2, s42 audit); a hook on the
        # activation module would see [T, k, I] in slot order, not the model's per-expert rows
        # (s53 probe). The model's own forward computes it
        return type(self).forward(self, hidden_states, top_k_index, top_k_weights)
    inter = self.down_proj.shape[-1]
    ids = top_k_index if top_k_index.dtype.is_signed and top_k_index.dtype.itemsize >= 4 else top_k_index.int()
    # eager: the implementation directly (the op's dispatcher hop cost 31 us a call, bench/
    # op_host_cost.py); a compiler's trace, a dispatch mode or a transform: the op
    run = dispatch_call if grad_form.direct((hidden_states, self.gate_up_proj, ids)) else group_gemm
    h = run(hidden_states, self.gate_up_proj, ids)
    a = self.act_fn(h[..., :inter]) * h[..., inter:]
    eager = getattr(getattr(self, "config", None), "_experts_implementation", None) in (None, "eager")
    # transformers' grouped_mm / batched_mm forms (grouped_mm is its default) weight each slot in
    # the promoted dtype and round once after the sum over k: fp32 routing weights (Mixtral's
    # router) on bf16 experts are applied here, not rounded to bf16 per slot by the op (a tiny
    # bf16 Mixtral's logits differed from plain on the CPU, s42 audit). Its eager form rounds
    # each weighted slot, as the op does
    weighted_here = not eager and top_k_weights.dtype != hidden_states.dtype
    y = run(a.contiguous(), self.down_proj, ids, None if weighted_here else top_k_weights)
    if weighted_here:
        y = y * top_k_weights.unsqueeze(-1)
    if eager and y.shape[1] > 2:
        return _add_in_expert_order(y, top_k_index).to(hidden_states.dtype)
    return y.sum(1).to(hidden_states.dtype)


def _watched(act: Any) -> bool:
    """Whether a hook watches the experts' activation module (its own, or every module's)."""
    from torch.nn.modules import module as nn_module

    own = getattr(act, "_forward_hooks", None) is not None and bool(
        act._forward_hooks or act._forward_pre_hooks or act._backward_hooks or act._backward_pre_hooks)
    return own or bool(nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks)


def _add_in_expert_order(y: Any, top_k_index: Any) -> Any:
    """y [T, k, H] summed over k as transformers' eager experts forward does: index_add_ into
    the output's dtype, one expert at a time in ascending id, each add rounded (a sum over k
    rounds once: a bf16 model with top-3 routing differed from plain, s42 audit)."""
    order = top_k_index.argsort(dim=1, stable=True)
    y = y.gather(1, order.unsqueeze(-1).expand_as(y))
    out = y[:, 0]
    for j in range(1, y.shape[1]):
        out = out + y[:, j]
    return out


def swap_experts(model: Any) -> list[str]:
    """Route every recognised experts module's forward through group_gemm; the names swapped."""
    from tunedb.families.group_gemm import ops

    ops.register()  # now, outside any trace (the swapped forward calls the op under torch.compile)
    swapped = []
    for info in find_experts(model):
        module = model.get_submodule(info.name)
        if getattr(module, "_tunedb_group_gemm", False):
            continue
        # a partial of this module's function, not a bound method: pickle names a method by its
        # attribute (`tuned_forward`, which the module lacks), so torch.load of a saved model failed
        module.forward = functools.partial(tuned_forward, module)
        module._tunedb_group_gemm = True
        swapped.append(info.name)
    return swapped


def main(argv: list[str] | None = None) -> int:
    """python -m tunedb.families.group_gemm.moe --models mixtral-8x7b,qwen3-30b-a3b --out F"""
    import argparse

    from tunedb.census.censusfile import merge, write_census

    p = argparse.ArgumentParser(prog="python -m tunedb.families.group_gemm.moe",
                                description="census of MoE expert GEMMs of transformers presets (meta tensors)")
    p.add_argument("--models", default="mixtral-8x7b,qwen1.5-moe-a2.7b,qwen3-30b-a3b",
                   help=f"comma-separated presets: {', '.join(PRESETS)}")
    p.add_argument("--tokens", default="1,2,4,8,16,32,64,128,256,512,1024,2048,4096")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    tokens = [int(t) for t in args.tokens.split(",")]
    sets = []
    for name in args.models.split(","):
        if name not in PRESETS:
            p.error(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
        sets.append(census(meta_model(name, layers=1), tokens, workload=name))
    result = merge(*sets)
    write_census(args.out, result)
    print(f"{len(result.points)} points over {len(result.signatures())} signatures -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
