"""TunedLinearLogSoftmax, optimize()'s fused head (families/gemm_log_softmax/census.py: the swap).

A class of this module (not one made inside a function) so that torch.save / pickle of an
optimized model can name it.
"""
from __future__ import annotations

import torch

from tunedb.errors import OperandMismatchError
from tunedb.families.gemm.left_modules import LINEAR_ATTRS, carried
from tunedb.runtime import autocast_rule, grad_form


class TunedLinearLogSoftmax(torch.nn.Module):
    """nn.Linear + nn.LogSoftmax(dim=-1) as one tunedb::gemm_log_softmax call (same parameters)."""

    def __init__(self, linear: torch.nn.Module) -> None:
        super().__init__()
        self.weight = linear.weight
        # nn.Linear(bias=False)'s own form, as TunedLinear keeps it: a None entry of _parameters,
        # so a bias added later with register_parameter (BitFit) works as on nn.Linear
        if linear.bias is None or isinstance(linear.bias, torch.nn.Parameter):
            self.register_parameter("bias", linear.bias)
        else:
            self.bias = linear.bias
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.train(linear.training)
        # a user's (or a library's) plain attributes on the Linear stay readable, as TunedLinear keeps them
        for name, value in vars(linear).items():
            if name not in self.__dict__ and name not in LINEAR_ATTRS and carried(value):
                self.__dict__[name] = value

    _scripts_plain = True  # fused_pair.FusedActivation: the LogSoftmax slot applies its module when scripted

    def __prepare_scriptable__(self) -> torch.nn.Module:
        from tunedb.families.script_plain import as_plain

        return as_plain(self, torch.nn.Linear)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"

    def reset_parameters(self) -> None:
        """nn.Linear's initialisation, in place on the same Parameters (a re-init loop asks
        hasattr(m, "reset_parameters"))."""
        torch.nn.Linear.reset_parameters(self)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        x = input  # nn's own parameter name: module(input=t) works as on the module replaced
        pair = self.__dict__.get("_tunedb_fused")  # census.optimize: the LogSoftmax's slot
        if pair is not None and not pair.fused_here():  # surgery, or called by other code: the slot applies its module
            return torch.nn.functional.linear(x, self.weight, self.bias)
        # torch's own pair for fp32 heads and under autocast (which casts the linear's
        # operands and runs log_softmax in fp32; the fused op takes one dtype and keeps it)
        # torch.fx's Proxy (symbolic_trace records torch's pair) and nested tensors likewise;
        # and under torch.func transforms (vmap of a model's forward), whose batching rule of
        # linear rounds apart from the unvmapped linear: torch's pair there is plain's bits (s42)
        if (not isinstance(x, torch.Tensor) or x.is_nested or x.dtype not in (torch.bfloat16, torch.float16)
                or autocast_rule.enabled(x.device.type) or grad_form.transformed()):
            return torch.log_softmax(torch.nn.functional.linear(x, self.weight, self.bias), dim=-1)
        from tunedb.families.gemm_log_softmax.ops import gemm_log_softmax

        if torch.compiler.is_compiling():
            return gemm_log_softmax(x, self.weight, self.bias)
        try:
            return gemm_log_softmax(x, self.weight, self.bias)
        except OperandMismatchError:
            # operands the op refuses (a K or dtype that does not fit, a bias torch broadcasts): the
            # plain pair's answer, torch's own error word for word or torch's result
            return torch.log_softmax(torch.nn.functional.linear(x, self.weight, self.bias), dim=-1)

