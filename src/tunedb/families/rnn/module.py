"""TunedLSTM / TunedGRU: optimize()'s nn.LSTM / nn.GRU with the served arm (families/rnn/census.py
swaps the class of the module in place, as the conv family does).

The module stays the object it was: its parameter names, state_dict keys, attributes, hooks and
`isinstance(m, nn.LSTM)` are the plain module's (a wrapper renamed every parameter under `rnn.`,
which an optimizer's param groups or a name filter would see). Classes of this module, not made
inside a function, so that torch.save / pickle of an optimized model can name them.
"""
from __future__ import annotations

from typing import Any

import torch

from tunedb.families.script_plain import as_plain
from tunedb.families.rnn import census
from tunedb.families.rnn.configs import FAMILY, module_signature


class _Served:
    """forward() of a served recurrent module: the arm the selector names for its key."""

    def _flatten_once(self) -> None:
        """nn's flatten_parameters() skips bf16, so cuDNN would copy the weights every call:
        flatten them in place once, again only after they moved (.to(), a new assignment)."""
        from tunedb.families.rnn.weights import capturing, flatten_module

        ptrs = tuple(w.data_ptr() for w in self._flat_weights)
        # the pointers when last flattened (or found flat), kept out of nn.Module's attributes
        if ptrs != self.__dict__.get("_tunedb_flat") and not capturing():
            flatten_module(self)
            self.__dict__["_tunedb_flat"] = tuple(w.data_ptr() for w in self._flat_weights)

    def forward(self, input: Any, hx: Any = None) -> Any:
        x = input  # nn's own parameter name: module(input=t) works as on the module replaced
        served = isinstance(x, torch.Tensor) and x.device.type == census.SERVED_DEVICE
        key = module_signature(self, x) if served else None
        if not isinstance(x, torch.Tensor) and isinstance(x, torch.fx.Proxy):
            # symbolic_trace: a call of this module, as it records nn.LSTM's (a leaf there); the
            # traced module then calls this forward with tensors
            tracer = x.tracer
            return tracer.create_proxy("call_module", tracer.path_of_module(self), (x,) if hx is None else (x, hx), {})
        if key is None:
            return super().forward(x, hx)  # type: ignore[misc]
        from tunedb.families.rnn.launch import arm_flags
        from tunedb.runtime import launch_table

        from tunedb import families

        config = launch_table.resolve(families.get(FAMILY), *key)[0]
        if config.lane == "triton_persistent" and not census._kernel_may_serve(self, x, hx):
            return super().forward(x, hx)  # type: ignore[misc]  # the module's own arm (torch's default) computes it
        if config.lane == "triton_persistent":  # LSTM only (the predicate)
            from tunedb.families.rnn.launch import persistent

            sig = key[0]
            shape = (sig.get("L") * (1 + sig.get("bidir")), sig.get("B"), sig.get("H"))
            h0, c0 = hx if hx is not None else (x.new_zeros(shape), x.new_zeros(shape))
            # torch's errors for a bad hx or an x of another dtype than the weights: the
            # kernel would read them unchecked
            self.check_forward_args(x, (h0, c0), None)
            return persistent(config, sig, x, h0, c0, *self._flat_weights, states=True)
        if config.id != "nocudnn":
            self._flatten_once()
        with arm_flags(config):
            return super().forward(x, hx)  # type: ignore[misc]



class TunedLSTM(_Served, torch.nn.LSTM):
    """An nn.LSTM run under the arm the selector serves for its key."""

    def __prepare_scriptable__(self) -> torch.nn.Module:
        return as_plain(self, torch.nn.LSTM)  # TorchScript compiles nn.LSTM's own forward


class TunedGRU(_Served, torch.nn.GRU):
    """An nn.GRU run under the arm the selector serves for its key."""

    def __prepare_scriptable__(self) -> torch.nn.Module:
        return as_plain(self, torch.nn.GRU)


TUNED = {torch.nn.LSTM: TunedLSTM, torch.nn.GRU: TunedGRU}
