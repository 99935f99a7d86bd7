"""What the protocol measures: a Problem (one signature at one M) and its Arms (one per config).

An Arm is a config id plus a factory ``make(args, kwargs, out) -> fn`` whose ``fn()`` launches
the kernel once, writing into the preallocated ``out``. A Problem carries the callables that
create random inputs, the reference and the output buffer. Timers only see these records, so
the protocol core works with toy arms in tests and with any kernel family in the build;
``problem_for(family, ...)`` adapts a KernelFamily. No torch import here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from tunedb.records import Signature

Args = tuple[Any, ...]
Kwargs = dict[str, Any]
Launch = Callable[[], Any]


@dataclass(frozen=True)
class Arm:
    """One candidate: a config id and how to launch it on given tensors."""

    config_id: str
    make: Callable[[Args, Kwargs, Any], Launch] | None = None  # None: only fake/replay timers


@dataclass(frozen=True)
class Problem:
    """One signature at one M and the arms competing on it.

    weight_args: positions in ``args`` of the weights, the tensors rotated through copies when
    the served working set exceeds L2 (None: every argument but the first, the activation).
    baseline_id: the framework op's arm; its own error sets the numerical gate's bound.
    policy: the input policy ("rotate", "ring" for ops that overwrite their input, "none"; see
    inputs.py). verify: the gate's rule ("tolerance", "exact", "residual"), factor and bound;
    residual(args, kwargs, out) -> float is the residual rule's measure, on the inputs the arm
    started from.
    """

    signature: Signature
    m: int
    arms: tuple[Arm, ...]
    make_inputs: Callable[[Any, int], tuple[Args, Kwargs]] | None = None
    reference: Callable[[Args, Kwargs], Any] | None = None
    make_out: Callable[[Args, Kwargs, Any], Any] | None = None  # (args, kwargs, ref) -> empty out
    weight_args: tuple[int, ...] | None = None
    baseline_id: str = "torch"
    baseline: Arm | None = None  # gates even when the baseline is not among the timed arms
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    policy: str = "rotate"
    verify: Any = None  # a families.contract.VerifyRule; None: tolerance, factor 4
    residual: Callable[[Args, Kwargs, Any], float] | None = None

    def __post_init__(self) -> None:
        ids = [a.config_id for a in self.arms]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"arm ids must be distinct; repeated: {', '.join(dupes)}")
        if not ids:
            raise ValueError(f"no arms to measure for {self.signature} at M={self.m}")

    @property
    def config_ids(self) -> tuple[str, ...]:
        return tuple(a.config_id for a in self.arms)

    def arm(self, config_id: str) -> Arm:
        for a in self.arms:
            if a.config_id == config_id:
                return a
        raise KeyError(config_id)

    def baseline_arm(self) -> Arm | None:
        for a in self.arms:
            if a.config_id == self.baseline_id:
                return a
        return self.baseline

    def weight_positions(self, args: Args) -> tuple[int, ...]:
        if self.weight_args is not None:
            return self.weight_args
        return tuple(range(1, len(args)))


def empty_like_reference(args: Args, kwargs: Kwargs, ref: Any) -> Any:
    """An output buffer shaped like the reference in the dtype of the first tensor argument."""
    import torch

    dtype = next((a.dtype for a in args if isinstance(a, torch.Tensor)), ref.dtype)
    device = next((a.device for a in args if isinstance(a, torch.Tensor)), ref.device)
    return torch.empty(ref.shape, dtype=dtype, device=device)


class _FamilyLaunch:
    """Picklable factory launching one family config (a closure would not cross the worker pipe)."""

    def __init__(self, family: Any, config: Any, sig: Signature) -> None:
        self.family, self.config, self.sig = family, config, sig

    def __call__(self, args: Args, kwargs: Kwargs, out: Any) -> Launch:
        family, config, sig = self.family, self.config, self.sig

        def fn() -> Any:
            return family.launch(config, sig, *args, out=out, **kwargs)

        return fn


def arms_for(family: Any, sig: Signature, config_ids: Sequence[str]) -> tuple[Arm, ...]:
    """One Arm per config id of a KernelFamily (sentinels included); ConfigError on a bad id."""
    arms = []
    for cid in dict.fromkeys(config_ids):
        arms.append(Arm(cid, _FamilyLaunch(family, family.parse_config(cid), sig)))
    return tuple(arms)


def problem_for(family: Any, sig: Signature, m: int, config_ids: Sequence[str]) -> Problem:
    """The Problem of measuring `config_ids` of a KernelFamily on `sig` at M: its problem factory,
    reference, input policy, verify rule and output buffer come from the family's contract."""
    if not isinstance(m, int) or isinstance(m, bool) or m < 1:
        raise ValueError(f"M={m!r} must be a positive int")
    if family is None:
        return Problem(sig, m, tuple(Arm(c) for c in dict.fromkeys(config_ids)))
    from tunedb.families.contract import InputPolicy, hook, verify_rule

    def make_inputs(device: Any, seed: int) -> tuple[Args, Kwargs]:
        args, kwargs = family.make_inputs(sig, m, device, seed)
        return tuple(args), dict(kwargs)

    def reference(args: Args, kwargs: Kwargs) -> Any:
        return family.reference(sig, *args, **kwargs)

    family_out = hook(family, "make_out")

    def make_out(args: Args, kwargs: Kwargs, ref: Any) -> Any:
        out = family_out(sig, args, kwargs, ref)
        return out if out is not None else empty_like_reference(args, kwargs, ref)

    rule = verify_rule(family, sig)
    family_residual = hook(family, "residual")

    def residual(args: Args, kwargs: Kwargs, out: Any) -> float | None:
        return family_residual(sig, args, kwargs, out)

    policy = InputPolicy(hook(family, "input_policy")(sig)).value
    fallback = hook(family, "pick_rule")().fallback
    baseline = None
    if fallback in family.sentinels(sig):
        baseline = arms_for(family, sig, [fallback])[0]
    weights = hook(family, "weight_args")(sig)
    return Problem(
        sig, m, arms_for(family, sig, config_ids), make_inputs=make_inputs, baseline=baseline,
        reference=reference, make_out=make_out if policy != "ring" else None,
        weight_args=tuple(weights) if weights is not None else None, baseline_id=fallback,
        meta={"family": getattr(family, "name", "")}, policy=policy, verify=rule, residual=residual if rule.kind == "residual" else None,
    )
