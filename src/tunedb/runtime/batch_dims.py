"""Leading batch dimensions folded into the one batch dimension tunedb's ops take, and restored:
the entry points' torch.linalg-style shapes (linalg, bmm), the bmm product mode's 4-D attention
products, and the ops' torch.vmap rules, which fold the vmapped dimension the same way."""
from __future__ import annotations

import functools
from typing import Any


def fold(tensors: tuple, cores: tuple, what: str) -> tuple[tuple, tuple]:
    """(each tensor as [prod(lead), *its `core` trailing dims], lead), lead being the first
    tensor's dims before its core. Another operand whose leading dims differ is refused, naming
    `what` (no broadcasting). The batch is the product, not -1: a 0 x 0 problem has no size to
    infer."""
    first = tensors[0]
    lead = tuple(first.shape[:first.dim() - cores[0]])
    for t, c in zip(tensors[1:], cores[1:]):
        other = tuple(t.shape[:t.dim() - c])
        if other != lead:
            from tunedb.errors import SignatureError

            raise SignatureError(f"{what}: the second operand's batch shape {list(other)} (shape {list(t.shape)}) "
                                 f"differs from the first's {list(lead)} (shape {list(first.shape)}); "
                                 f"batch dimensions must match (no broadcasting)")
    batch = functools.reduce(lambda x, y: x * y, lead, 1)
    return tuple(t.reshape(batch, *t.shape[t.dim() - c:]) for t, c in zip(tensors, cores)), lead


def unfold(out: Any, lead: tuple) -> Any:
    """An op's result (a tensor or a tuple of them, each [prod(lead), ...]) as [*lead, ...]."""
    if isinstance(out, tuple):
        return tuple(o.reshape(lead + tuple(o.shape[1:])) for o in out)
    return out.reshape(lead + tuple(out.shape[1:]))


def vmapped_front(tensors: tuple, in_dims: tuple, size: int) -> tuple:
    """The operands of a torch.vmap rule with the vmapped dimension first: moved there, or, for an
    operand not vmapped (in_dim None), expanded to `size` (a view)."""
    return tuple(t.unsqueeze(0).expand(size, *t.shape) if d is None else t.movedim(d, 0)
                 for t, d in zip(tensors, in_dims))
