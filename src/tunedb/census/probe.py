"""Taking a census: replay traffic into probe keys, run each key once under the recorder, and
weight what it recorded. Produces a records.ShapeSet.

Per point (signature, M): calls = sum over keys of (forwards at the key) * (calls per forward);
weight = its share of all recorded calls (weights sum to 1 when any traffic was replayed);
must_tune when a captured key reaches it (even one the traffic never hit); eager_share = the
share of its calls made by keys above the capture limit (1 for those keys, 0 for captured ones).
"""
from __future__ import annotations

import contextlib
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator

from tunedb.census import modes
from tunedb.census.presets import AUDIO, Workload
from tunedb.errors import CensusError, TunedbError
from tunedb.records import HALF_DTYPES, Point, ShapeSet, Signature


def traffic(w: Workload, mode: str, max_batch: int, chunk: int | None, manifest: str | Path | None,
            seed: int = 0) -> Counter[modes.Key]:
    """The probe keys of `mode` with their forward counts (see tunedb.census.modes), refused
    before any forward runs where a batch's rows (batch x length) pass a census's largest M."""
    counts = _traffic(w, mode, max_batch, chunk, manifest, seed)
    from tunedb.census.censusfile import M_MAX

    worst = max(counts, key=lambda k: k.batch * max(k.length, 1), default=None)
    if worst is not None and worst.batch * max(worst.length, 1) > M_MAX:
        raise CensusError(f"a batch of {worst.batch} x {worst.length} {'frames' if w.unit == AUDIO else 'tokens'} "
                          f"is {worst.batch * worst.length} rows, past the {M_MAX} a census point (and a kernel's "
                          f"32-bit M) holds; lower --max-batch-size or the manifest's longest entry")
    return counts


def _traffic(w: Workload, mode: str, max_batch: int, chunk: int | None, manifest: str | Path | None,
             seed: int = 0) -> Counter[modes.Key]:
    if mode not in modes.MODES:
        raise CensusError(f"unknown mode {mode!r}; modes are {', '.join(modes.MODES)}")
    if chunk is not None and mode != "streaming":  # it would be recorded and repeated, doing nothing
        raise CensusError(f"--chunk-size applies only to --mode streaming (this census is --mode {mode}); "
                          f"drop it, or add --mode streaming")
    field = {"decode": "output_tokens"}.get(mode, "duration" if w.unit == AUDIO else "tokens")
    values = modes.read_manifest(manifest, field) if manifest else modes.synthetic(field, seed=seed)
    if mode == "decode":
        if not w.decoder:
            raise CensusError(f"{w.name} is an encoder-only model: it has no decode steps; "
                              f"use --mode offline{' or streaming' if w.streaming else ''}")
        return modes.decode([int(v) for v in values], max_batch, seed=seed)
    lengths = modes.frames(values, w.fixed_length) if w.unit == AUDIO else [int(v) for v in values]
    if mode == "streaming":
        if not w.streaming:
            raise CensusError(f"{w.name} cannot stream: it is a fixed-window or causal LM workload; "
                              "use --mode offline" + (" or decode" if w.decoder else ""))
        if chunk is None:
            raise CensusError("--mode streaming needs --chunk-size (input frames per chunk)")
        return modes.streaming(lengths, max_batch, chunk, seed=seed)
    return modes.offline(lengths, max_batch, w.max_length, w.length_step, w.fixed_length,
                         captured=(mode == "offline"))


def probe(built: Any, key: modes.Key, model: Any = None, quantizer: Any = None) -> Counter[tuple[Signature, int]]:
    """Run one forward at `key` under the recorder. With `model` (tunedb.optimize of the built
    model) the tuned ops' calls are recorded as the run time keys them (gemm_act with its bias and
    activation), and the aten recorder counts only the GEMMs outside them. quantizer: the family's
    census quantizer (the census_quantizer hook) whose recorder keys the quantized layers' calls
    (the aten calls inside them are not counted again)."""
    from tunedb.census.recorder import record

    inputs = built.decode_inputs(key.batch) if key.length == 0 else built.inputs(key.batch, key.length)
    if quantizer is not None:
        with quantizer.recorder() as qrec:
            calls = probe(built, key, model)
        calls.update(qrec.calls)
        return calls
    if model is None:
        return record(lambda: built.model(*inputs))
    from tunedb.runtime import launch_table

    with launch_table.recording() as tuned:
        calls = record(lambda: model(*inputs), patched=True)
    for _family, sig, m in tuned:
        # a call on no rows (an empty slice of x) launches no kernel; the aten rules skip it too
        # (census_rules: rows < 1), and a Point of M=0 is invalid (tune stopped with a traceback)
        if m >= 1:
            calls[(_census_dt(sig), m)] += 1
    return calls


def _census_dt(sig: Signature) -> Signature:
    """The census's dtype of a tuned call: `half` for fp16/bf16 where the family keys that
    generic dtype (gemm, bmm, conv), else the call's own (group_gemm and gemm_log_softmax key
    bf16 and fp16 apart: their calls were keyed dt=half, which the family does not tune)."""
    from tunedb import families

    if sig.dt not in HALF_DTYPES or sig.family not in families.names():
        return sig
    dtypes = families.get(sig.family).schema.dtypes
    return sig.with_dt("half") if not dtypes or "half" in dtypes else sig


def _device(name: str) -> Any:
    """The torch.device a census builds the model on; CensusError for a name torch does not
    know or a CUDA device this machine lacks."""
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as exc:
        raise CensusError(f"--device {name!r} is not a torch device ({exc}); use meta (the default: no weights), "
                          f"cpu or cuda") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CensusError(f"--device {name!r}: no CUDA GPU here; use meta (the default: no weights, same shapes) or cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise CensusError(f"--device {name!r}: this machine has {torch.cuda.device_count()} CUDA device(s) "
                          f"(cuda:0 to cuda:{torch.cuda.device_count() - 1}); or use meta or cpu")
    return device


@contextlib.contextmanager
def _user_code(w: Workload, where: str, device: Any = None) -> Iterator[None]:
    """A module:callable workload's own code failing (its factory, its forward on the probe's
    inputs) is the user's to fix: one CensusError naming the workload, the step, and the error;
    on meta tensors, a forward that reads tensor values (data-dependent control flow, .item(),
    nonzero) is told to take the census on a device that holds them."""
    import sys

    argv = sys.argv
    if ":" in w.name:  # an argparse parser in the user's code reads its own empty command line, not tunedb's
        sys.argv = [w.name.partition(":")[0]]
    try:
        yield
    except TunedbError:
        raise
    except SystemExit as exc:  # sys.exit() or an argparse call in the user's code ended the command
        if ":" not in w.name:
            raise
        raise CensusError(f"workload {w.name!r} called sys.exit({exc.code!r}) in {where} (an argparse parser "
                          f"reading tunedb's own command line does): a workload's factory and forward must "
                          f"return, not exit") from None
    except Exception as exc:
        if ":" not in w.name:  # a preset failing is tunedb's bug: keep its traceback
            raise
        hint = (" (a census runs the model at each probe's batch and length, in --unit; the lengths come from "
                "--manifest, else a synthetic distribution, and a batch past --max-length runs at its own "
                "length: docs/census.md)") if "forward" in where else ""
        if _wrong_device(exc):
            hint = (f" (the workload's input_factory must make its tensors on the device it is given -- "
                    f"`torch.randn(..., device=device)` -- as the factory builds the model there: "
                    f"{getattr(device, 'type', device)} for this census)")
        elif getattr(device, "type", None) == "meta" and _needs_values(exc):
            hint = (f" (the model reads tensor values -- data-dependent control flow, .item(), nonzero -- "
                    f"which meta tensors, the census's default device, do not hold: take the census on the "
                    f"CPU with random weights: `tunedb tune {w.name} --device cpu` with the same flags, or "
                    f"`tunedb census {w.name} --device cpu --fused --out census.json` then on a GPU "
                    f"`tunedb build --census census.json --out user`)")
        raise CensusError(f"workload {w.name!r} failed in {where}: {type(exc).__name__}: {exc}{hint}") from exc
    finally:
        sys.argv = argv


def _wrong_device(exc: BaseException) -> bool:
    """Whether an error is torch's refusal of operands on two devices (the inputs made elsewhere
    than the model), which names meta too, so it is asked before _needs_values."""
    text = str(exc)
    return "is not on the expected device" in text or "Expected all tensors to be on the same device" in text


def _needs_values(exc: BaseException) -> bool:
    """Whether an error is a meta tensor's lack of data (torch names meta, or a data-dependent op)."""
    text = str(exc).lower()
    return "meta" in text or "data-dependent" in text or "data-independent" in text


def census_quantizer(scheme: str) -> Any:
    """The first registered family's quantizer for `scheme` (its census_quantizer hook)."""
    from tunedb import families
    from tunedb.families.contract import hook

    for name in families.names():
        found = hook(families.get(name), "census_quantizer")(scheme)
        if found is not None:
            return found
    raise CensusError(f"no registered kernel family quantizes a model with scheme {scheme!r} "
                      f"(the quantized families offer fp8-rowwise, fp8-block and int8)")


def _modules(model: Any) -> tuple[Any, ...]:
    """The submodules of a built model: an nn.Module, or a runner holding one as `.model`; none
    for another callable (a workload may return any callable as its model)."""
    import torch

    for m in (model, getattr(model, "model", None)):
        if isinstance(m, torch.nn.Module):
            return tuple(m.modules())
    return ()


def _optimized(w: Workload, model: Any) -> Any:
    """tunedb.optimize of a built model, patched in place: an nn.Module, or a runner holding one
    as `.model` (the presets' causal-LM runner)."""
    import torch

    from tunedb.runtime.patching import optimize

    if isinstance(model, torch.nn.Module):
        return optimize(model, inplace=True, families="all")
    inner = getattr(model, "model", None)
    if isinstance(inner, torch.nn.Module):
        model.model = optimize(inner, inplace=True, families="all")
        return model
    raise CensusError(f"{w.name}: the fused census (--fused, tune's default) needs the model to be a "
                      f"torch.nn.Module (or hold one as .model); got {type(model).__name__}: return the "
                      f"module, or pass --no-fused")


def _half_dtype(model: Any) -> str | None:
    """The model's 16-bit float dtype ('bf16' / 'fp16'), which the calls keyed `dt=half` run in (a
    plan resolves their keys in it: an entry autotune wrote under the call's own dtype serves them),
    or None (fp32, or both)."""
    import torch

    names = {torch.bfloat16: "bf16", torch.float16: "fp16"}
    seen = {names[p.dtype] for p in getattr(model, "parameters", lambda: ())() if p.dtype in names}
    return seen.pop() if len(seen) == 1 else None


def _experts_unkeyed(model: Any) -> str:
    """The modules an aten-level census cannot key (each family's `aten_unkeyed` hook: group_gemm's
    mixture-of-experts blocks): their count and the first name, or '' (the fused census keys them
    as optimize() calls them)."""
    from tunedb import families
    from tunedb.families.contract import has_hook, hook

    found: list[str] = []
    for name in families.names():
        family = families.get(name)
        if has_hook(family, "aten_unkeyed"):
            try:
                found += list(hook(family, "aten_unkeyed")(model))
            except Exception:  # a model a family cannot read: say nothing rather than fail the census
                continue
    return f"{len(found)} ({found[0]}, ...)" if found else ""


def take_census(w: Workload, mode: str = "offline", max_batch: int = 8, chunk: int | None = None,
                manifest: str | Path | None = None, device: str = "meta", impl: str = "auto",
                seed: int = 0, fused: bool = False, quantization: str | None = None,
                progress: Callable[[int, int, str], None] | None = None) -> ShapeSet:
    """The census of workload `w` served in `mode` (see the module docstring for the weights).
    progress(done, total, what): told before each step (building the model, optimize(), each
    probe forward) and once more at the end (done == total), for a display; the census is the
    same without it.
    fused: take it of tunedb.optimize(model), so a Linear that optimize() fuses with its
    activation is keyed as the gemm_act call the run time makes (bias and act included).
    quantization: a torchao scheme (fp8-rowwise, fp8-block, int8) applied to the full-precision
    model before probing; its Linears are then keyed under the quantized families."""
    import torch

    quantizer = census_quantizer(quantization) if quantization is not None else None
    if quantizer is not None:
        quantizer.require()  # before building the model: a missing library fails fast
    keys = traffic(w, mode, max_batch, chunk, manifest, seed)
    dev = _device(device)
    steps = 2 + len(keys)
    tell = progress or (lambda done, total, what: None)
    tell(0, steps, f"{w.name}: building the model")
    with _user_code(w, "building the model"):
        built = w.build(dev, impl)
    if quantizer is not None:
        quantizer.quantize(built.model, device)
    if mode == "decode" and built.decode_inputs is None:
        raise CensusError(f"{w.name} returned no decode_factory: it is encoder-only and has no decode steps")
    tell(1, steps, f"{w.name}: tunedb.optimize(model)")
    with _user_code(w, "tunedb.optimize(model)"):
        model = _optimized(w, built.model) if fused else None
    calls: Counter[tuple[Signature, int]] = Counter()
    eager: Counter[tuple[Signature, int]] = Counter()
    must: set[tuple[Signature, int]] = set()
    for i, key in enumerate(sorted(keys)):
        where = f"its forward at batch={key.batch}, " + (f"length={key.length} {w.unit}" if key.length else "one decode step")
        tell(2 + i, steps, f"{w.name}: {where}")
        with _user_code(w, where, dev):
            recorded = probe(built, key, model, quantizer)
        if not recorded:
            # the torch base class's name: optimize() may have swapped an LSTM's class to TunedLSTM
            lstm = sorted({c.__name__ for m in _modules(built.model) for c in type(m).__mro__
                           if c.__module__ == "torch.nn.modules.rnn"} & {"LSTM", "GRU", "RNN"})
            why = (f"; its {', '.join(lstm)} layer(s) are not in tune's census (the rnn family tunes them: "
                   "tunedb.optimize(model, families='all'), docs/rnn.md)") if lstm else (
                   "; the census records the aten GEMMs, batched products and convolutions a family keys")
            raise CensusError(f"{w.name}: the probe at batch={key.batch}, length={key.length} ran no call a family "
                              f"records{why}")
        for point, n in recorded.items():
            calls[point] += keys[key] * n
            if key.captured:
                must.add(point)
            else:
                eager[point] += keys[key] * n
    tell(steps, steps, f"{w.name}: done")
    wanted = getattr(quantizer, "family", None)
    if wanted and not any(sig.family == wanted for sig, _m in calls):
        raise CensusError(f"{w.name}: --quantization {quantization} recorded no {wanted} call: the quantized "
                          f"Linears ran as torchao's own kernels, which the census cannot key (their activations' "
                          f"dtype is not one the scheme's tunedb op takes: bf16 or fp16)")
    total = sum(calls.values())
    points = []
    for point in sorted(set(calls) | must):
        c = calls[point]
        share = eager[point] / c if c else (0.0 if point in must else 1.0)
        points.append(Point(point[0], point[1], weight=(c / total if total else 0.0), calls=c,
                            must_tune=point in must, eager_share=share))
    unkeyed = () if fused else _experts_unkeyed(built.model)
    meta = (("mode", mode), ("impl", built.impl), ("device", str(device)), ("fused", "yes" if fused else "no"),
            *((("dtype", half),) if (half := _half_dtype(built.model)) else ()),
            *((("experts_not_recorded", unkeyed),) if unkeyed else ()),
            *((("quantization", quantization),) if quantization else ()),
            ("max_batch_size", str(max_batch)),
            ("chunk_size", str(chunk or "")), ("traffic", str(manifest) if manifest else f"synthetic(seed={seed})"),
            ("keys", str(len(keys))), ("forwards", str(sum(keys.values()))))
    return ShapeSet(tuple(points), w.name, meta)
