"""Workloads: the built-in presets (published architecture configs, hard-coded) and user models.

A workload knows how to build its model on a device (meta for a CPU census) and how to make the
inputs of one probe: ``inputs(batch, length)`` for offline/prefill/streaming keys and, for
decoders, ``decode_inputs(batch)`` for one decode step. Lengths are input frames (10 ms log-mel
frames) for audio encoders and tokens for language models.

User workloads are named ``module:callable``. The callable is called with ``device`` (a
torch.device) and returns ``(model, input_factory)`` or ``(model, input_factory, decode_factory)``:
``input_factory(batch, length) -> tuple`` of positional inputs for ``model(*inputs)``, and
``decode_factory(batch) -> tuple`` the inputs of one decode step (give it only for decoders).

Implementations (``impl``): ``auto`` uses transformers (Whisper, Llama) or torchaudio (Conformer)
when importable and the mirror modules otherwise; ``mirror``, ``hf`` and ``torchaudio`` force one.
"""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import Any, Callable

from tunedb.errors import CensusError

AUDIO, TEXT = "frames", "tokens"
USER_MAX_LENGTH = 3000  # a module:callable workload's default capture limit, in its unit


@dataclass(frozen=True)
class Built:
    """A model on a device with its probe-input factories."""

    model: Any
    inputs: Callable[[int, int], tuple]
    decode_inputs: Callable[[int], tuple] | None
    impl: str


@dataclass(frozen=True)
class Workload:
    name: str
    unit: str  # AUDIO (input frames, 100 per second) or TEXT (tokens)
    build: Callable[[Any, str], Built]  # (torch.device, impl) -> Built
    fixed_length: int | None = None  # a fixed-window encoder (Whisper: 3000 frames), keyed exactly
    max_length: int = 3000  # the capture limit of the offline grid, in `unit`
    length_step: int = 0  # offline length buckets: multiples of this; 0: the M-bucket ladder
    streaming: bool = False  # accepts chunked input (a streaming encoder)
    decoder: bool = False  # has decode steps
    config: tuple[tuple[str, Any], ...] = ()  # the published values the preset hard-codes


WHISPER = {
    "whisper-base": dict(d_model=512, encoder_layers=6, heads=8, ffn=2048, n_mels=80),
    "whisper-large-v3": dict(d_model=1280, encoder_layers=32, heads=20, ffn=5120, n_mels=128),
}
WHISPER_FRAMES = 3000  # a 30 s log-mel window; the encoder sees 1500 positions after conv2
CONFORMER = dict(input_dim=512, num_heads=8, ffn_dim=2048, num_layers=16, depthwise_conv_kernel_size=31,
                 n_mels=80)
LLAMA_3_8B = dict(hidden=4096, intermediate=14336, layers=32, heads=32, kv_heads=8, vocab=128256)
# Llama-3.2-3B: decode weights of 6-50 MB (q 3072x3072, k/v 1024x3072, gate/up 8192x3072, down
# 3072x8192) between the audio presets' and Llama-3-8B's, and a head tied to the embedding
LLAMA_3_2_3B = dict(hidden=3072, intermediate=8192, layers=28, heads=24, kv_heads=8, vocab=128256, tied=1)


_LIBRARY_CLASS = {"hf": ("transformers", "LlamaForCausalLM"), "torchaudio": ("torchaudio.models", "Conformer")}


_IMPL_TEXT = {
    "hf": "Hugging Face transformers",
    "torchaudio": "torchaudio",
    "mirror": "tunedb's built-in copy, the same tuned keys",
    "user": "the module:callable given",
}


def describe_impl(impl: str) -> str:
    """One line naming the model implementation a census used (a census meta's 'impl')."""
    text = _IMPL_TEXT.get(impl)
    if text is None:
        return f"model implementation: {impl}"
    hint = "" if impl == "user" else "; --impl picks another"
    return f"model implementation: {impl} ({text}{hint})"


def _importable(impl: str) -> bool:
    """Whether the library behind `impl` imports here (installed is not enough: a torchaudio or
    transformers built for another torch fails at import)."""
    module, attr = _LIBRARY_CLASS[impl]
    if importlib.util.find_spec(module.partition(".")[0]) is None:
        return False
    try:
        return hasattr(importlib.import_module(module), attr)
    except Exception:  # noqa: BLE001 - any import failure means: use the mirror
        return False


def _choose(impl: str, library: str, allowed: tuple[str, ...]) -> str:
    if impl not in allowed + ("auto",):
        raise CensusError(f"impl={impl!r} is not available here; use one of auto, {', '.join(allowed)}")
    if impl == "auto":
        return library if _importable(library) else "mirror"
    if impl != "mirror" and not _importable(impl):
        package = _LIBRARY_CLASS[impl][0].partition(".")[0]
        raise CensusError(f"impl={impl!r} needs the {package} package, which does not import here")
    return impl


def _dtype():
    import torch

    return torch.bfloat16


def _build_whisper(name: str) -> Callable[[Any, str], Built]:
    cfg = WHISPER[name]

    def build(device: Any, impl: str) -> Built:
        import torch

        impl = _choose(impl, "hf", ("mirror", "hf"))
        with torch.device(device):
            if impl == "hf":
                from transformers import WhisperConfig
                from transformers.models.whisper.modeling_whisper import WhisperEncoder

                hf = WhisperConfig(d_model=cfg["d_model"], encoder_layers=cfg["encoder_layers"],
                                   encoder_attention_heads=cfg["heads"], encoder_ffn_dim=cfg["ffn"],
                                   num_mel_bins=cfg["n_mels"], max_source_positions=WHISPER_FRAMES // 2)
                hf._attn_implementation = "eager"
                model = WhisperEncoder(hf)
            else:
                from tunedb.census.models import WhisperEncoderMirror

                model = WhisperEncoderMirror(cfg["d_model"], cfg["encoder_layers"], cfg["heads"], cfg["ffn"],
                                             cfg["n_mels"], WHISPER_FRAMES // 2)
        model = model.to(_dtype()).eval()

        def inputs(batch: int, length: int) -> tuple:
            if length != WHISPER_FRAMES:
                raise CensusError(f"{name} takes exactly {WHISPER_FRAMES} log-mel frames, got {length}")
            return (torch.randn(batch, cfg["n_mels"], length, dtype=_dtype(), device=device),)

        return Built(model, inputs, None, impl)

    return build


def _build_conformer(device: Any, impl: str) -> Built:
    import torch

    from tunedb.census.models import ConformerEncoder, ConformerMirror, ConvSubsampling

    impl = _choose(impl, "torchaudio", ("mirror", "torchaudio"))
    c = CONFORMER
    with torch.device(device):
        if impl == "torchaudio":
            from torchaudio.models import Conformer

            body = Conformer(input_dim=c["input_dim"], num_heads=c["num_heads"], ffn_dim=c["ffn_dim"],
                             num_layers=c["num_layers"], depthwise_conv_kernel_size=c["depthwise_conv_kernel_size"])
        else:
            body = ConformerMirror(c["input_dim"], c["num_heads"], c["ffn_dim"], c["num_layers"],
                                   c["depthwise_conv_kernel_size"])
        model = ConformerEncoder(ConvSubsampling(c["n_mels"], c["input_dim"]), body)
    model = model.to(_dtype()).eval()

    def inputs(batch: int, length: int) -> tuple:
        if length < 7:
            raise CensusError(f"conformer needs at least 7 input frames for its stride-4 front end, got {length}")
        return (torch.randn(batch, length, c["n_mels"], dtype=_dtype(), device=device),)

    return Built(model, inputs, None, impl)


def _build_llama(c: dict[str, int]) -> Callable[[Any, str], Built]:
    return lambda device, impl: _llama(c, device, impl)


def _llama(c: dict[str, int], device: Any, impl: str) -> Built:
    import torch

    impl = _choose(impl, "hf", ("mirror", "hf"))
    tied = bool(c.get("tied", 0))
    with torch.device(device):
        if impl == "hf":
            from transformers import LlamaConfig, LlamaForCausalLM

            hf = LlamaConfig(hidden_size=c["hidden"], intermediate_size=c["intermediate"],
                             num_hidden_layers=c["layers"], num_attention_heads=c["heads"],
                             num_key_value_heads=c["kv_heads"], vocab_size=c["vocab"],
                             max_position_embeddings=8192, rope_theta=500000.0, tie_word_embeddings=tied)
            hf._attn_implementation = "eager"
            model = LlamaForCausalLM(hf)
        else:
            from tunedb.census.models import LlamaMirror

            model = LlamaMirror(c["hidden"], c["intermediate"], c["layers"], c["heads"], c["kv_heads"], c["vocab"])
            if tied:
                model.lm_head.weight = model.embed_tokens.weight
    model = model.to(_dtype()).eval()

    def ids(batch: int, length: int) -> torch.Tensor:
        return torch.randint(0, c["vocab"], (batch, length), device=device)

    if impl == "hf":
        # An explicit additive 4D mask: transformers' own mask builder inspects values (.item()),
        # which meta tensors do not have. Prefill, like generate(), keeps the last position's logits.
        def inputs(batch: int, length: int) -> tuple:
            mask = torch.zeros(batch, 1, length, length, dtype=_dtype(), device=device)
            return (_HFCall(ids(batch, length), mask),)

        def decode_inputs(batch: int) -> tuple:
            return (_HFCall(ids(batch, 1), torch.zeros(batch, 1, 1, 1, dtype=_dtype(), device=device)),)

        return Built(_HFRunner(model), inputs, decode_inputs, impl)

    return Built(model, lambda b, n: (ids(b, n),), lambda b: (ids(b, 1),), impl)


@dataclass(frozen=True)
class _HFCall:
    input_ids: Any
    attention_mask: Any


class _HFRunner:
    """Calls a transformers causal LM the way generation does (no cache object, last logits only)."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def __call__(self, call: _HFCall) -> Any:
        return self.model(input_ids=call.input_ids, attention_mask=call.attention_mask, use_cache=False,
                          logits_to_keep=1)


PRESETS: dict[str, Workload] = {
    "whisper-base": Workload("whisper-base", AUDIO, _build_whisper("whisper-base"), fixed_length=WHISPER_FRAMES,
                             max_length=WHISPER_FRAMES, config=tuple(WHISPER["whisper-base"].items())),
    "whisper-large-v3": Workload("whisper-large-v3", AUDIO, _build_whisper("whisper-large-v3"),
                                 fixed_length=WHISPER_FRAMES, max_length=WHISPER_FRAMES,
                                 config=tuple(WHISPER["whisper-large-v3"].items())),
    "conformer": Workload("conformer", AUDIO, _build_conformer, max_length=3000, length_step=200,
                          streaming=True, config=tuple(CONFORMER.items())),
    "llama-3-8b": Workload("llama-3-8b", TEXT, _build_llama(LLAMA_3_8B), max_length=8192, decoder=True,
                           config=tuple(LLAMA_3_8B.items())),
    "llama-3.2-3b": Workload("llama-3.2-3b", TEXT, _build_llama(LLAMA_3_2_3B), max_length=8192, decoder=True,
                             config=tuple(LLAMA_3_2_3B.items())),
}


# What a module:callable workload must be (shown in --help and in the error that refuses one).
CALLABLE_CONTRACT = ("module:callable names a function f(device) called as f(device=torch.device(...)) "
                     "returning (model, input_factory[, decode_factory]); input_factory(batch, length) "
                     "returns model(*inputs)'s inputs, decode_factory(batch) one decode step's")


def _check_takes_device(spec: str, factory: Any) -> None:
    import inspect

    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin without a signature: let the call decide
        return
    takes = "device" in params and params["device"].kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                              inspect.Parameter.KEYWORD_ONLY)
    if not takes and not any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values()):
        raise CensusError(f"workload {spec!r} takes ({', '.join(params)}) but must accept device=: "
                          f"{CALLABLE_CONTRACT}")


def import_user_module(name: str) -> Any:
    """The workload's module. As `python -m tunedb` does (and the `tunedb` console script does
    not), a module in the working directory imports: `tunedb tune mymodel:make` run beside
    mymodel.py failed with ModuleNotFoundError. The directory joins PYTHONPATH as well, for the
    measuring worker's process."""
    import os
    import sys

    top = name.partition(".")[0]
    cwd = os.getcwd()
    here = os.path.exists(os.path.join(cwd, f"{top}.py")) or os.path.isdir(os.path.join(cwd, top))
    if here and cwd not in sys.path and "" not in sys.path:
        # first, as `python -m` puts it: a test.py here imported the standard library's `test`
        sys.path.insert(0, cwd)
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (cwd, os.environ.get("PYTHONPATH", "")) if p)
    return importlib.import_module(name)


def _user_workload(spec: str, unit: str, max_length: int, length_step: int) -> Workload:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise CensusError(f"workload {spec!r} must be module:callable, both named; {CALLABLE_CONTRACT}")
    if module_name.endswith(".py") or "/" in module_name or "\\" in module_name:
        # a file path (mymodel.py:make, ./mymodel:make) failed in importlib with a message that
        # did not say what to give instead
        import os

        where, stem = os.path.split(module_name.removesuffix(".py"))
        raise CensusError(f"workload {spec!r} names a file; give its module: {stem}:{attr}, run in "
                          f"{where or '.'} (or with that directory on PYTHONPATH)")
    try:
        factory = getattr(import_user_module(module_name), attr)
    except Exception as exc:  # the user's module runs at import: any error of its own is its message
        raise CensusError(f"cannot load workload {spec!r}: {type(exc).__name__}: {exc}") from exc
    except SystemExit as exc:  # a script's sys.exit() at import ended the command silently
        raise CensusError(f"cannot load workload {spec!r}: importing {module_name} called sys.exit({exc.code!r}); "
                          f"a workload module must import without running its script") from None
    if not callable(factory):
        raise CensusError(f"workload {spec!r} is not callable")
    _check_takes_device(spec, factory)

    def build(device: Any, impl: str) -> Built:
        out = factory(device=device)
        if not isinstance(out, tuple) or len(out) not in (2, 3) or not all(callable(x) for x in out):
            raise CensusError(f"workload {spec!r} must return (model, input_factory[, decode_factory]), got {out!r:.100}")
        decode = _positional(spec, "decode_factory", out[2]) if len(out) == 3 else None
        return Built(out[0], _positional(spec, "input_factory", out[1]), decode, "user")

    return Workload(spec, unit, build, max_length=max_length, length_step=length_step, streaming=True,
                    decoder=True)


def _positional(spec: str, name: str, make: Callable[..., Any]) -> Callable[..., tuple]:
    """`make` checked to return the model's positional inputs (a tuple or list): the census calls
    model(*inputs), which a dict would turn into its keys and a tensor into its rows."""
    def inputs(*args: int) -> tuple:
        got = make(*args)
        if not isinstance(got, (tuple, list)):
            raise CensusError(f"workload {spec!r}: {name}({', '.join(map(str, args))}) returned a "
                              f"{type(got).__name__}; it must return a tuple of the model's positional inputs "
                              f"(the census calls model(*inputs); for keyword inputs, wrap the model in a module "
                              f"whose forward takes them positionally)")
        return tuple(got)
    return inputs


MAX_USER_LENGTH = 1 << 20


def check_lengths(name: str, unit: str = AUDIO, max_length: int = USER_MAX_LENGTH, length_step: int = 0) -> None:
    """CensusError for bad length settings (--unit, --max-length, --length-step) of a
    module:callable workload `name`; a preset fixes its own lengths, so one given another value
    is refused rather than ignored (session 53: `--max-length 5` on a preset did nothing)."""
    if name in PRESETS:
        given = [f"{flag} {value}" for flag, value, default in (("--unit", unit, AUDIO),
                 ("--max-length", max_length, USER_MAX_LENGTH), ("--length-step", length_step, 0))
                 if value != default]
        if given:
            raise CensusError(f"{', '.join(given)}: preset {name!r} fixes its own input lengths; these options "
                              f"shape a module:callable workload's probe lengths only")
        return
    if ":" not in name:
        return
    if unit not in (AUDIO, TEXT):
        raise CensusError(f"length unit {unit!r} is not one of {AUDIO}, {TEXT}")
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
        raise CensusError(f"--max-length={max_length!r} must be a positive int (the offline capture limit, in {unit})")
    if max_length > MAX_USER_LENGTH:
        raise CensusError(f"--max-length={max_length} is above {MAX_USER_LENGTH} (M = batch x length must stay "
                          f"a 32-bit size)")
    if isinstance(length_step, bool) or not isinstance(length_step, int) or length_step < 0:
        raise CensusError(f"--length-step={length_step!r} must be an int >= 0 (0: the M-bucket ladder)")
    if length_step > max_length:
        raise CensusError(f"--length-step={length_step} is larger than --max-length={max_length}: no length "
                          f"would be captured; use a step from 0 to {max_length}")


def _json_hint(name: str) -> str:
    """What a .json workload argument should be: a Hugging Face config (its `model_type` or
    `architectures`) is built by a module:callable; else a census file is measured by build."""
    import json
    from pathlib import Path

    from tunedb.input_files import read_text

    data = None
    try:
        if Path(name).is_file():  # not a FIFO: a hint must not wait for a writer
            data = json.loads(read_text(name))
    except Exception:  # noqa: BLE001 - missing, unreadable, not JSON, nested past the recursion limit: the census hint stands
        data = None
    if isinstance(data, dict) and ("model_type" in data or "architectures" in data):
        return (f"; {name} is a Hugging Face config, which tunedb does not read: give a module:callable "
                f"that builds the model from it (e.g. `transformers.AutoModelForCausalLM.from_config("
                f"transformers.AutoConfig.from_pretrained('{name}'))` returned by a function in your module)")
    if not Path(name).exists():
        return f"; no file {name} exists (a census file is measured by `tunedb build --census {name}`)"
    return f"; a census file is measured by `tunedb build --census {name}`"


def workload(name: str, unit: str = AUDIO, max_length: int = USER_MAX_LENGTH, length_step: int = 0) -> Workload:
    """A preset by name, or a user model named module:callable (unit/max_length/length_step apply to it)."""
    if name in PRESETS:
        check_lengths(name, unit, max_length, length_step)  # lengths given to a preset: refused, not ignored
        return PRESETS[name]
    if ":" in name:
        check_lengths(name, unit, max_length, length_step)
        return _user_workload(name, unit, max_length, length_step)
    hint = ""
    import os

    if name.endswith(".json"):  # a census file (tunedb census --out; a .jsonl is a measurement log, not one)
        hint = _json_hint(name)
    elif os.path.isdir(name):
        config = os.path.join(name, "config.json")
        hint = (f"; {name} is a directory" + (" (a Hugging Face checkout: tunedb does not read its config; give a "
                f"module:callable that builds the model from {config})" if os.path.isfile(config) else ""))
    else:
        import difflib

        norm = {p.replace("-", "").replace(".", "").replace("_", "").lower(): p for p in PRESETS}
        close = difflib.get_close_matches(name.replace("-", "").replace(".", "").replace("_", "").lower(), norm, 1, 0.75)
        hint = f" (did you mean {norm[close[0]]!r}?)" if close else ""
    raise CensusError(f"unknown workload {name!r}; presets are {', '.join(PRESETS)}, or give module:callable{hint}")
