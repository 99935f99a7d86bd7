"""Recurrent-layer keys and configs: signatures, the arms, THE validity predicate (pure Python).

    rnn|op=lstm|dt=bf16|I=320|H=320|L=1|bias=1|bidir=0|bf=1|B=16     size axis T (sequence length)

The key holds what fixes the kernels of nn.LSTM / nn.GRU (input and hidden sizes, layers,
biases, directions, batch-first layout) and the batch size; the size axis is the sequence length.
Arms: `torch` (cuDNN, through torch's own dispatch: the fallback and the untuned choice),
`nocudnn` (torch's native kernels under torch.backends.cudnn.flags(enabled=False): one GEMM for
the input projection, then a small GEMM + fused cell kernel per step) and the Triton
sequence-persistent LSTM kernel `pl_bb{BB}_bh{BH}_bk{BK}_w{W}` (kernels.py; docs/rnn.md).
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Sequence

from tunedb.errors import ConfigError, SignatureError
from tunedb.families.key_rules import head_reason
from tunedb.records import SENTINELS, ArchProfile, Config, Signature

FAMILY = "rnn"
OPS: tuple[str, ...] = ("lstm", "gru")
GATES = {"lstm": 4, "gru": 3}
DTYPES: tuple[str, ...] = ("bf16", "fp16", "fp32")
LANES: tuple[str, ...] = ("torch", "torch_native", "triton_persistent")
PERSISTENT_DTYPES = ("bf16", "fp16")  # fp32 would run tl.dot in TF32: not offered
_PL = re.compile(r"^pl_bb(?P<bb>\d+)_bh(?P<bh>\d+)_bk(?P<bk>\d+)_w(?P<w>\d+)$")
_PL_BLOCKS = (16, 32, 64, 128)
_PL_TILES = ((16, 32, 64, 4), (16, 64, 64, 4), (16, 128, 64, 8), (32, 64, 64, 4), (64, 64, 64, 8))
FAMILY_SENTINELS: tuple[str, ...] = ("default", "torch")
NATIVE = Config("nocudnn", "torch_native", ())
KEY = (("I", int), ("H", int), ("L", int), ("bias", int), ("bidir", int), ("bf", int), ("B", int))
_DT = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32"}
BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def sig_reason(sig: Signature) -> str | None:
    why = head_reason(sig, FAMILY, OPS, DTYPES, ("I", "H", "L", "B"))
    if why:
        return why
    for name in ("bias", "bidir", "bf"):
        if sig.get(name) not in (0, 1):
            return f"{name}={sig.get(name)!r} must be 0 or 1"
    return None


def make_signature(op: str, dt: str, i: int, h: int, layers: int = 1, bias: int = 1, bidir: int = 0,
                   bf: int = 1, b: int = 1) -> Signature:
    sig = Signature(FAMILY, op, dt, (("I", int(i)), ("H", int(h)), ("L", int(layers)), ("bias", int(bias)),
                                     ("bidir", int(bidir)), ("bf", int(bf)), ("B", int(b))))
    why = sig_reason(sig)
    if why:
        raise SignatureError(f"bad rnn signature {sig.format()!r}: {why}")
    return sig


def dt_of(dtype: Any) -> str:
    dt = _DT.get(str(dtype))
    if dt is None:
        raise SignatureError(f"rnn takes {', '.join(_DT)} inputs, got {dtype}")
    return dt


def rnn_op(module: Any) -> str | None:
    """"lstm" / "gru" for an nn.LSTM / nn.GRU or a subclass (optimize()'s TunedLSTM, a user's
    own), else None; read from the class's bases, so this module needs no torch."""
    for cls in type(module).__mro__:
        if cls.__module__ == "torch.nn.modules.rnn" and cls.__name__.lower() in OPS:
            return cls.__name__.lower()
    return None


def module_signature(module: Any, x: Any) -> tuple[Signature, int] | None:
    """(Signature, T) of an nn.LSTM / nn.GRU call on a batched tensor x; None where the call is
    not served (PackedSequence, unbatched input, LSTM projections, another dtype)."""
    op = rnn_op(module)
    if op is None or not hasattr(x, "shape") or len(x.shape) != 3 or getattr(module, "proj_size", 0):
        return None
    if str(x.dtype) not in _DT:
        return None
    bf = int(bool(module.batch_first))
    b, t = (x.shape[0], x.shape[1]) if bf else (x.shape[1], x.shape[0])
    if int(t) < 1 or int(b) < 1:
        return None
    return make_signature(op, _DT[str(x.dtype)], module.input_size, module.hidden_size, module.num_layers,
                          int(bool(module.bias)), int(bool(module.bidirectional)), bf, int(b)), int(t)


def signature_of(op: str, x: Any, h0: Any, *rest: Any, bidirectional: bool = False,
                 batch_first: bool = True, bias: bool = True) -> tuple[Signature, int]:
    """(Signature, T) of a call launch() takes: x, h0 (, c0 for LSTM), the flat weights."""
    if op not in OPS:
        raise SignatureError(f"unknown rnn op {op!r}; ops are {', '.join(OPS)}")
    if len(x.shape) != 3 or len(h0.shape) != 3:
        raise SignatureError(f"rnn needs x [B, T, I] (or [T, B, I]) and h0 [L*D, B, H]; got {list(x.shape)}, {list(h0.shape)}")
    weights = rest[1:] if op == "lstm" else rest
    d = 2 if bidirectional else 1
    ld, b, h = (int(v) for v in h0.shape)
    if ld % d:
        raise SignatureError(f"h0 has {ld} layer-directions, not a multiple of {d} directions")
    bx, t, i = (x.shape[0], x.shape[1], x.shape[2]) if batch_first else (x.shape[1], x.shape[0], x.shape[2])
    if int(bx) != b:
        raise SignatureError(f"rnn x has batch {bx} but h0 has {b}")
    per = 4 if bias else 2
    if len(weights) != ld * per:
        raise SignatureError(f"rnn expects {ld * per} weight tensors (L*D={ld}, bias={bias}), got {len(weights)}")
    if tuple(weights[0].shape) != (GATES[op] * h, int(i)):
        raise SignatureError(f"{op} w_ih_l0 has shape {list(weights[0].shape)}; expected [{GATES[op] * h}, {int(i)}]")
    return make_signature(op, dt_of(x.dtype), int(i), h, ld // d, int(bias), int(bidirectional),
                          int(batch_first), b), int(t)


def work(sig: Signature, t: int) -> tuple[float, float]:
    """(flops, bytes): input and recurrent GEMMs over every step, layer and direction; weights,
    input and output once."""
    g, i, h, layers, d, b = GATES[sig.op], sig.get("I"), sig.get("H"), sig.get("L"), 1 + sig.get("bidir"), sig.get("B")
    flops = moved = 0.0
    for layer in range(layers):
        inp = i if layer == 0 else d * h
        flops += d * 2.0 * t * b * g * h * (inp + h)
        moved += d * g * h * (inp + h)
    moved += t * b * (i + d * h)
    return flops, moved * BYTES[sig.dt]


def persistent(bb: int, bh: int, bk: int, warps: int) -> Config:
    """A `triton_persistent` config: BB batch rows a program, BH gate columns x BK inputs a block."""
    for name, v in (("BB", bb), ("BH", bh), ("BK", bk)):
        if v not in _PL_BLOCKS:
            raise ConfigError(f"triton_persistent config: {name}={v} not allowed; use one of {_PL_BLOCKS}")
    if warps not in (4, 8):
        raise ConfigError(f"triton_persistent config: warps={warps} not allowed; use 4 or 8")
    return Config(f"pl_bb{bb}_bh{bh}_bk{bk}_w{warps}", "triton_persistent",
                  (("bb", bb), ("bh", bh), ("bk", bk), ("warps", warps)))


def parse(config_id: str) -> Config:
    if config_id == NATIVE.id:
        return NATIVE
    m = _PL.match(config_id) if isinstance(config_id, str) else None
    if m:
        cfg = persistent(int(m["bb"]), int(m["bh"]), int(m["bk"]), int(m["w"]))
        if cfg.id != config_id:
            raise ConfigError(f"config id {config_id!r} is not canonical; expected {cfg.id!r}")
        return cfg
    if config_id in FAMILY_SENTINELS:
        return Config.sentinel(config_id)
    allowed = FAMILY_SENTINELS + (NATIVE.id,)
    if config_id in SENTINELS:
        raise ConfigError(f"rnn has no {config_id!r} arm; arms: {', '.join(allowed)}")
    raise ConfigError(f"bad rnn config id {config_id!r}; arms: {', '.join(allowed)} or pl_bb16_bh64_bk64_w4")


def config_space(arch_family: str, lanes: Sequence[str] | None = None) -> tuple[Config, ...]:
    wanted = set(lanes or LANES)
    bad = wanted - set(LANES)
    if bad:
        raise ConfigError(f"unknown rnn lane(s) {sorted(bad)}; lanes are {', '.join(LANES)}")
    out = (NATIVE,) if "torch_native" in wanted else ()
    if "triton_persistent" in wanted:
        out += tuple(persistent(*t) for t in _PL_TILES)
    return out


def invalid_reason(cfg: Config, sig: Signature, m: int | None, arch: ArchProfile) -> str | None:
    """THE validity predicate: the signature is this family's and the arm is one of its own."""
    why = sig_reason(sig)
    if why:
        return why
    if cfg.id in FAMILY_SENTINELS or cfg == NATIVE:
        return None
    if cfg.lane != "triton_persistent" or _PL.match(cfg.id) is None:
        return f"{cfg.id!r} is not an rnn arm (arms: {', '.join(FAMILY_SENTINELS + (NATIVE.id,))}, pl_*)"
    if sig.op != "lstm":
        return f"triton_persistent runs LSTM cells only (op={sig.op})"
    if sig.dt not in PERSISTENT_DTYPES:
        return f"triton_persistent takes {', '.join(PERSISTENT_DTYPES)} (dt={sig.dt}: tl.dot would round fp32 to TF32)"
    bb, bh, bk = cfg.param("bb"), cfg.param("bh"), cfg.param("bk")
    if bb > max(16, 1 << (sig.get("B") - 1).bit_length()):
        return f"BB={bb} exceeds batch B={sig.get('B')} rounded up to a power of two"
    h = sig.get("H")
    if max(bh, bk) > max(32, 1 << (h - 1).bit_length()):
        return f"BH={bh} or BK={bk} exceeds H={h} rounded up to a power of two"
    if 4 * bb * bh // (32 * cfg.param("warps")) > 128:
        return f"four [BB, BH] fp32 gate accumulators exceed 128 registers a thread (BB={bb}, BH={bh})"
    return None


def compile_set(arch_family: str, referenced: Iterable[str]) -> tuple[Config, ...]:
    return tuple(Config.sentinel(s) for s in FAMILY_SENTINELS) + config_space(arch_family)


def simplicity(config_id: str) -> int:
    """cuDNN, then torch's native path, then the Triton kernel."""
    if config_id in FAMILY_SENTINELS:
        return 0
    return 1 if config_id == NATIVE.id else 2


__all__ = ["FAMILY", "OPS", "NATIVE", "make_signature", "signature_of", "module_signature", "work",
           "parse", "config_space", "invalid_reason", "compile_set", "simplicity"]
