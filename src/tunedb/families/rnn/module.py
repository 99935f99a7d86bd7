"""TunedRNN, optimize()'s wrapper of an nn.LSTM / nn.GRU (families/rnn/census.py: the swap).

A class of this module (not one made inside a function) so that torch.save / pickle of an
optimized model can name it. Its state_dict keys are the wrapped module's (no `rnn.` level). Attributes the wrapper does not have (hidden_size, num_layers,
flatten_parameters(), ...) are the wrapped module's, so a model's own forward that reads
`self.lstm.hidden_size` or calls `self.lstm.flatten_parameters()` runs as before.
"""
from __future__ import annotations

from typing import Any

import torch

from tunedb.families.rnn import census
from tunedb.families.rnn.configs import FAMILY, module_signature


class TunedRNN(torch.nn.Module):
    """An nn.LSTM / nn.GRU run under the arm the selector serves for its key."""

    def __init__(self, rnn: torch.nn.Module) -> None:
        super().__init__()
        self.rnn = rnn
        self._flat: tuple[int, ...] = ()  # the weights' pointers when last flattened (or found flat)
        # state_dict keys as the wrapped module's: a plain model's checkpoint loads into the
        # optimized one and back (the wrapper's `rnn.` level made both fail on missing keys)
        self.register_state_dict_post_hook(_unwrapped_keys)
        self.register_load_state_dict_pre_hook(_wrapped_keys)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)  # parameters, buffers and submodules (self.rnn)
        except AttributeError:
            # __dict__ read directly: while unpickling, _modules may not be there yet
            rnn = self.__dict__.get("_modules", {}).get("rnn")
            if rnn is None:
                raise
            return getattr(rnn, name)

    def __setattr__(self, name: str, value: Any) -> None:
        # a plain attribute of the wrapped module (dropout, batch_first, ...) is written there, where
        # its forward reads it (on the wrapper the write was silently ignored); the wrapper's own
        # state, modules, parameters and `training` (train()/eval() set it on both) stay here
        rnn = self.__dict__.get("_modules", {}).get("rnn")
        if (rnn is not None and name != "training" and not name.startswith("_") and name in rnn.__dict__
                and not isinstance(value, (torch.nn.Module, torch.Tensor))):
            setattr(rnn, name, value)
            return
        super().__setattr__(name, value)

    def _flatten_once(self) -> None:
        """nn's flatten_parameters() skips bf16, so cuDNN would copy the weights every call:
        flatten them in place once, again only after they moved (.to(), a new assignment)."""
        from tunedb.families.rnn.weights import capturing, flatten_module

        ptrs = tuple(w.data_ptr() for w in self.rnn._flat_weights)
        if ptrs != self._flat and not capturing():
            flatten_module(self.rnn)
            self._flat = tuple(w.data_ptr() for w in self.rnn._flat_weights)

    def forward(self, input: Any, hx: Any = None) -> Any:
        x = input  # nn's own parameter name: module(input=t) works as on the module replaced
        served = isinstance(x, torch.Tensor) and x.device.type == census.SERVED_DEVICE
        key = module_signature(self.rnn, x) if served else None
        if key is None:
            return self.rnn(x, hx)
        from tunedb.families.rnn.launch import arm_flags
        from tunedb.runtime import launch_table

        from tunedb import families

        config = launch_table.resolve(families.get(FAMILY), *key)[0]
        if config.lane == "triton_persistent" and not census._kernel_may_serve(self.rnn, x, hx):
            return self.rnn(x, hx)  # the module's own arm (torch's default) computes it
        if config.lane == "triton_persistent":  # LSTM only (the predicate)
            from tunedb.families.rnn.launch import persistent

            sig = key[0]
            shape = (sig.get("L") * (1 + sig.get("bidir")), sig.get("B"), sig.get("H"))
            h0, c0 = hx if hx is not None else (x.new_zeros(shape), x.new_zeros(shape))
            # torch's errors for a bad hx or an x of another dtype than the weights: the
            # kernel would read them unchecked
            self.rnn.check_forward_args(x, (h0, c0), None)
            return persistent(config, sig, x, h0, c0, *self.rnn._flat_weights, states=True)
        if config.id != "nocudnn":
            self._flatten_once()
        with arm_flags(config):
            return self.rnn(x, hx)


def _unwrapped_keys(module: TunedRNN, state_dict: Any, prefix: str, local_metadata: Any) -> None:
    """state_dict(): `<prefix>rnn.<name>` -> `<prefix><name>`, the plain model's keys."""
    inner = prefix + "rnn."
    for key in [k for k in state_dict if k.startswith(inner)]:
        state_dict[prefix + key[len(inner):]] = state_dict.pop(key)


def _wrapped_keys(module: TunedRNN, state_dict: Any, prefix: str, *_: Any) -> None:
    """load_state_dict(): the plain model's `<prefix><name>` -> `<prefix>rnn.<name>` (a state
    dict saved with the `rnn.` level, by an earlier tunedb, loads as it is)."""
    rnn = module._modules["rnn"]
    names = {*rnn._parameters, *rnn._buffers}
    for key in [k for k in state_dict if k.startswith(prefix) and k[len(prefix):] in names]:
        state_dict[prefix + "rnn." + key[len(prefix):]] = state_dict.pop(key)
