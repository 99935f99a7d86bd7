"""Input policies: what each timed launch of an arm runs on (families.contract.InputPolicy).

ROTATE: the problem's inputs plus copies of its weights, rotated call by call, so that each call
reads cold weights when the served working set exceeds L2 (rotation_copies says how many);
activations and outputs are shared. RING: a bounded ring of fresh valid inputs made by the
family's problem factory, one slot per timed call, restored from pristine copies by
``restore()`` before every replay -- outside the timed region -- so that a timed launch never
sees its own output (ops that overwrite their input: a solver timed on its own output would
time a different problem). NONE: one set of inputs, reused.

The CUDA-graph timer captures its graph of N calls over ``slot_of(i)`` and captures
``restore`` as a graph replayed before each timed replay; the eager timer runs the same schedule
on any device. torch is imported inside the functions.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

POLICIES: tuple[str, ...] = ("rotate", "ring", "none")


@dataclass
class InputSets:
    """The argument sets of one point's timed calls and how to reset them between replays."""

    policy: str
    sets: list[tuple[tuple[Any, ...], dict[str, Any]]]
    pristine: list[tuple[Any, ...]] = field(default_factory=list)  # RING: the slots' originals

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"input policy {self.policy!r}; allowed: {', '.join(POLICIES)}")

    @property
    def depth(self) -> int:
        return len(self.sets)

    def slot_of(self, call: int) -> int:
        """The set the call-th launch of a replay runs on. RING: each slot once per replay."""
        return call % len(self.sets)

    def restore(self) -> None:
        """RING: copy every slot back from its pristine original (call it outside the timed
        region, before each replay); a no-op for the other policies."""
        for (args, _), originals in zip(self.sets, self.pristine):
            for dst, src in zip(args, originals):
                if src is not None:
                    dst.copy_(src)

    def tensors(self) -> list[Any]:
        return [a for args, _ in self.sets for a in args] + [a for p in self.pristine for a in p]


def _clone_tensors(args: Sequence[Any]) -> tuple[Any, ...]:
    import torch

    return tuple(a.clone() if isinstance(a, torch.Tensor) else None for a in args)


def rotate(args: tuple[Any, ...], kwargs: dict[str, Any], positions: Sequence[int], copies: int) -> InputSets:
    """The problem's own inputs, then copies-1 sets sharing everything but the weights."""
    sets = [(tuple(args), kwargs)]
    for _ in range(copies - 1):
        sets.append((tuple(a.clone() if i in positions else a for i, a in enumerate(args)), kwargs))
    return InputSets("rotate", sets)


def ring(make_inputs: Callable[[Any, int], tuple[tuple[Any, ...], dict[str, Any]]], device: Any,
         seed: int, depth: int) -> InputSets:
    """`depth` fresh valid input sets from the problem factory (seeds seed+1 ... seed+depth, so
    the gate's inputs, made with `seed`, are not among them) and their pristine copies."""
    if depth < 1:
        raise ValueError(f"ring depth={depth} must be >= 1")
    sets, pristine = [], []
    for i in range(depth):
        args, kwargs = make_inputs(device, seed + 1 + i)
        sets.append((tuple(args), dict(kwargs)))
        pristine.append(_clone_tensors(args))
    return InputSets("ring", sets, pristine)


def none(args: tuple[Any, ...], kwargs: dict[str, Any]) -> InputSets:
    return InputSets("none", [(tuple(args), kwargs)])


def fresh_copy(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """A copy of the tensors in `args` (other values as they are): the gate runs an in-place arm
    on one, so every arm starts from the same valid problem."""
    import torch

    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
