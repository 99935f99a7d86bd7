"""The `rnn` family (spec 000's recurrent layers; issue 25): nn.LSTM and nn.GRU keyed by their
sizes, layers, biases, directions, layout and batch, with the sequence length as the size axis.

Arms: `torch` (cuDNN: the fallback and the untuned choice, so a tuned pick is never below it
beyond the gate), `nocudnn` (torch's native kernels) and `triton_persistent` (one Triton launch
walks every step of an LSTM layer; bf16/fp16). Importing this package touches neither torch nor
triton. See docs/rnn.md.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from tunedb.families.contract import source_hash
from tunedb.families.config_methods import ConfigMethods
from tunedb.families.rnn import configs
from tunedb.records import ArchProfile, Config, Signature


@lru_cache(maxsize=1)
def impl_hash() -> str:
    return source_hash(Path(__file__).parent, ("launch.py", "kernels.py", "weights.py"))


class RnnFamily(ConfigMethods):
    """See tunedb.families.KernelFamily."""

    configs = configs  # ConfigMethods' six protocol members answer from this module
    name = configs.FAMILY
    ops = configs.OPS
    lanes = configs.LANES

    @property
    def schema(self) -> Any:
        from tunedb.families.contract import SignatureSchema

        return SignatureSchema(key=configs.KEY, size="T", ladder="m",
                               choices=(("bias", (0, 1)), ("bidir", (0, 1)), ("bf", (0, 1))), dtypes=configs.DTYPES)

    def verify(self, sig: Signature) -> Any:
        """The output within 4x cuDNN's own relative error against the fp32 (fp64) reference."""
        from tunedb.families.contract import VerifyRule

        return VerifyRule(kind="tolerance", factor=4.0)

    def pick_rule(self) -> Any:
        from tunedb.families.contract import PickRule

        return PickRule(fallback="torch", simplicity=configs.simplicity)

    def input_policy(self, sig: Signature) -> Any:
        """One input set: the weights are views of one flat buffer that cuDNN uses in place
        (rotated copies would be separate tensors, which cuDNN copies into one every call), and
        a recurrent layer rereads them every step anyway (warm after the first)."""
        from tunedb.families.contract import InputPolicy

        return InputPolicy.NONE

    def make_out(self, sig: Signature, args: Any, kwargs: Any, reference: Any) -> Any:
        return args[0].new_empty(reference.shape)

    def census_rules(self) -> tuple[Any, ...]:
        """None at the aten level (census.py says why); census.record() keys the modules."""
        return ()

    def optimize(self, model: Any, approximate: bool = False) -> Any:
        from tunedb.families.rnn.census import optimize

        return optimize(model)

    def make_signature(self, op: str, dt: str, i: int, h: int, layers: int = 1, bias: int = 1,
                       bidir: int = 0, bf: int = 1, b: int = 1) -> Signature:
        return configs.make_signature(op, dt, i, h, layers, bias, bidir, bf, b)

    def signature_of(self, op: str, x: Any, h0: Any, *rest: Any, **kwargs: Any) -> tuple[Signature, int]:
        return configs.signature_of(op, x, h0, *rest, **kwargs)

    def work(self, sig: Signature, m: int) -> tuple[float, float]:
        return configs.work(sig, m)

    def sentinels(self, sig: Signature, approximate: bool = False) -> tuple[str, ...]:
        return configs.FAMILY_SENTINELS

    def default_config(self, sig: Signature, arch: ArchProfile | None = None) -> Config:
        return Config.sentinel("torch")

    def launch(self, config: Config, sig: Signature, x: Any, h0: Any, *rest: Any, out: Any = None) -> Any:
        from tunedb.families.rnn.launch import launch

        return launch(config, sig, x, h0, *rest, out=out)

    def reference(self, sig: Signature, x: Any, h0: Any, *rest: Any, dtype: Any = None) -> Any:
        from tunedb.families.rnn.launch import reference

        return reference(sig, x, h0, *rest, dtype=dtype)

    def make_inputs(self, sig: Signature, m: int, device: Any, seed: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        from tunedb.families.rnn.launch import make_inputs

        return make_inputs(sig, m, device, seed)

    impl_hash = staticmethod(impl_hash)  # the module function: the protocol member


FAMILY = RnnFamily()

__all__ = ["FAMILY", "RnnFamily", "impl_hash"]
