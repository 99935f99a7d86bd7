"""TunedLinear under torch.jit.script and torch.jit.trace: the forwards those two record.

TunedLinear.forward's eager body is Python TorchScript cannot compile (the launch table's memo,
`_parameters`, module globals), and torch.jit.trace would record what it ran: on CUDA a Triton
launch is no aten op, so a trace would keep its output as a constant, and on the CPU the path
depends on the grad mode (torch.jit.trace's own check re-runs the model under no_grad, and
failed on every optimized model). Both therefore record the tuned op itself, which resolves
per call like any dispatcher call of it (docs/runtime.md); a scripted or traced model saved
with torch.jit.save needs `import tunedb.families.gemm.ops` where it is loaded.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from tunedb.families.gemm import fused_pair


def script_forward(self: Any, input: torch.Tensor) -> torch.Tensor:
    """The source torch.jit.script compiles for TunedLinear.forward (see TunedLinear)."""
    return torch.ops.tunedb.gemm_act(input, self.weight, self.bias, self._script_act)


def traced_forward(module: Any, by_parent: bool, x: torch.Tensor) -> torch.Tensor:
    """TunedLinear's forward while torch.jit.trace records it: the tuned op through the
    dispatcher, where the tracer sees it, whatever the grad mode and device; a fused activation
    module on the CPU runs as in eager mode (the model's own rounding, TunedLinear.forward).
    by_parent: whether the pair's parent's code made this call (TunedLinear._slow_forward)."""
    weight, bias, act = module.weight, module.bias, module.act
    act_module = module.__dict__.get("_act_module")
    if not by_parent or fused_pair.live_act(module, act) != act:  # the slot applies it (or no one)
        act, act_module = "none", None
    pair = module.__dict__.get("_tunedb_fused")
    if pair is not None:  # the slot, traced next, takes this decision (fused_pair.taken)
        fused_pair.decided(pair, act != "none")
    if act_module is not None and x.is_cpu:
        return act_module(F.linear(x, weight, bias))
    if bias is None and act == "none":
        return torch.ops.tunedb.gemm(x, weight)
    return torch.ops.tunedb.gemm_act(x, weight, bias, act)
