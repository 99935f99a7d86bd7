"""Service modes and traffic: key sets, replay weights, capture limits, manifests, determinism."""
import json
from pathlib import Path

import pytest

from tunedb.census import modes
from tunedb.census.modes import Key
from tunedb.census.presets import AUDIO, Built, Workload, workload
from tunedb.census.probe import take_census, traffic
from tunedb.errors import CensusError

MANIFEST = Path(__file__).parents[1] / "data" / "manifests" / "synthetic_24.jsonl"


def test_batch_buckets():
    assert modes.batch_buckets(1) == (1,)
    assert modes.batch_buckets(32) == (1, 2, 4, 8, 16, 32)
    assert modes.batch_buckets(24) == (1, 2, 4, 8, 16, 24)
    with pytest.raises(CensusError, match="max-batch-size=0"):
        modes.batch_buckets(0)


def test_whisper_windows_are_keyed_exactly():
    # 12.3 s is one 3000-frame window, 45 s two: never 3008 or any rounded length.
    assert modes.frames([12.3, 45.0], fixed_length=3000) == [3000, 3000, 3000]
    assert modes.frames([12.3]) == [1230]


def test_offline_grid_replay_and_capture_limit():
    lengths = [150, 190, 390, 410, 1000]
    keys = modes.offline(lengths, max_batch=2, max_length=800, step=200)
    grid = {Key(b, l, True) for b in (1, 2) for l in (200, 400, 600, 800)}
    assert grid <= set(keys)
    # Sorted and batched two at a time: (150, 190) -> (2, 200); (390, 410) -> (2, 600);
    # (1000) is above the capture limit: eager at its exact size.
    assert keys[Key(2, 200, True)] == 1 and keys[Key(2, 600, True)] == 1
    assert keys[Key(1, 1000, False)] == 1
    assert sum(keys.values()) == 3
    prefill = modes.offline(lengths, 2, 800, 0, captured=False)
    assert all(not k.captured for k in prefill) and sum(prefill.values()) == 3
    assert Key(2, 512, False) in prefill  # a prompt of 410 tokens pads to its M bucket


def test_streaming_and_decode_key_sets():
    lengths = modes.frames(modes.synthetic("duration", n=300))
    keys = modes.streaming(lengths, max_batch=6, chunk=64)
    assert set(keys) == {Key(w, 64, True) for w in range(1, 7)}
    assert sum(keys.values()) >= sum(-(-n // 64) for n in lengths) / 6
    dec = modes.decode([int(t) for t in modes.synthetic("output_tokens", n=300)], max_batch=4)
    assert set(dec) == {Key(b, 0, True) for b in range(1, 5)}
    # Replays are seeded: the same traffic gives the same histogram.
    assert modes.streaming(lengths, 6, 64) == keys
    with pytest.raises(CensusError, match="chunk-size"):
        modes.streaming(lengths, 6, 0)


def test_concurrency_replay_conserves_work():
    jobs = [3, 1, 4, 1, 5, 9, 2, 6]
    hist = modes.concurrency(jobs, max_batch=3, seed=1)
    assert sum(w * steps for w, steps in hist.items()) == sum(jobs)
    assert max(hist) <= 3


def test_synthetic_distribution_is_seeded_and_clipped():
    a = modes.synthetic("duration", n=500, seed=3)
    assert a == modes.synthetic("duration", n=500, seed=3) != modes.synthetic("duration", n=500, seed=4)
    assert min(a) >= 0.5 and max(a) <= 40.0


def test_manifest_errors_name_the_line_and_field(tmp_path):
    bad = tmp_path / "m.jsonl"
    bad.write_text(json.dumps({"duration": 1.0}) + "\n" + json.dumps({"duration": "x"}) + "\n")
    with pytest.raises(CensusError, match="line 2: 'duration' must be a positive number"):
        modes.read_manifest(bad, "duration")
    bad.write_text("{not json\n")
    with pytest.raises(CensusError, match="line 1 is not JSON"):
        modes.read_manifest(bad, "duration")
    assert len(modes.read_manifest(MANIFEST, "duration")) == 24


@pytest.mark.parametrize("field, top", [("duration", "86400 s (24 h)"), ("tokens", "16777216 tokens"),
                                        ("output_tokens", "1048576 tokens")])
def test_an_absurd_manifest_value_is_refused_with_the_allowed_range(tmp_path, field, top):
    """1e9 s (samples or ms written as seconds) overflowed torch's size arithmetic in the probe;
    a value past the bound is a mistake to fix, not traffic to weight (nor to clamp silently)."""
    bound = modes.MANIFEST_MAX[field][0]
    ok = tmp_path / "ok.jsonl"
    ok.write_text(json.dumps({field: bound}) + "\n")
    assert modes.read_manifest(ok, field) == [float(bound)]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({field: 3}) + "\n" + json.dumps({field: 1e9 if field != "tokens" else 1e12}) + "\n")
    with pytest.raises(CensusError) as exc:
        modes.read_manifest(bad, field)
    allowed = "a positive number" if field == "duration" else "a whole number >= 1"  # tokens: whole (s55)
    assert str(exc.value) == (f"manifest {bad} line 2: {field!r} must be {allowed} at most {top}, "
                              f"got {1e9 if field != 'tokens' else 1e12!r}")


def test_manifest_replay_weights_sum_to_one():
    census = take_census(workload("whisper-base"), "offline", max_batch=4, manifest=MANIFEST, impl="mirror")
    assert sum(p.weight for p in census.points) == pytest.approx(1.0)
    gemm = [p for p in census.points if p.signature.op == "gemm"]
    # 24 utterances, two longer than 30 s (one of them > 60 s): 27 windows in batches of 4 ->
    # 6 batches of 4 and one of 3 (padded to 4). Every key is captured.
    assert {p.m for p in gemm} == {1500, 3000, 6000}
    assert all(p.must_tune and p.eager_share == 0.0 for p in gemm)
    by_m = {p.m: p for p in gemm if p.signature.get("N") == 2048}
    assert by_m[6000].calls == 7 * 6 and by_m[1500].calls == 0 and by_m[1500].weight == 0.0


def tiny_audio_workload(max_length):
    """A two-Linear model over (B, T, 8) features: M = B * T exactly."""
    def build(device, impl):
        import torch

        with torch.device(device):
            model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)).half()
        return Built(model, lambda b, t: (torch.randn(b, t, 8, device=device, dtype=torch.half),), None, "user")
    return Workload("tiny", AUDIO, build, max_length=max_length, length_step=200, streaming=True)


def test_eager_keys_above_the_capture_limit():
    census = take_census(tiny_audio_workload(400), "offline", max_batch=4, manifest=MANIFEST)
    # 24 utterances in 6 batches of 4; only the first batch (<= 400 frames) is captured.
    captured = [p for p in census.points if p.must_tune and p.calls]
    assert {p.m for p in captured} == {4 * 400}
    eager = [p for p in census.points if p.eager_share == 1.0]
    assert eager and all(not p.must_tune and p.calls > 0 for p in eager)
    assert sum(p.weight for p in census.points) == pytest.approx(1.0)


def test_mode_refusals():
    with pytest.raises(CensusError, match="encoder-only"):
        traffic(workload("conformer"), "decode", 4, None, None)
    with pytest.raises(CensusError, match="cannot stream"):
        traffic(workload("whisper-base"), "streaming", 4, 16, None)
    with pytest.raises(CensusError, match="needs --chunk-size"):
        traffic(workload("conformer"), "streaming", 4, None, None)
    with pytest.raises(CensusError, match="unknown mode"):
        traffic(workload("conformer"), "batch", 4, None, None)


def test_streaming_census_keys_every_cohort_width():
    census = take_census(tiny_audio_workload(400), "streaming", max_batch=3, chunk=64, manifest=MANIFEST)
    assert {p.m for p in census.points} == {64, 128, 192}
    assert all(p.must_tune and p.eager_share == 0.0 for p in census.points)
    assert sum(p.weight for p in census.points) == pytest.approx(1.0)


def test_llama_decode_census():
    census = take_census(workload("llama-3-8b"), "decode", max_batch=3, impl="mirror")
    head = {p.m: p for p in census.points if p.signature.get("N") == 128256}
    assert set(head) == {1, 2, 3} and all(p.must_tune for p in head.values())
    down = {p.m: p for p in census.points if p.signature.get("K") == 14336}
    # 32 down projections per step against one LM head call: same steps, 32x the calls.
    assert all(down[m].calls == 32 * head[m].calls for m in head)
    assert sum(p.weight for p in census.points) == pytest.approx(1.0)


@pytest.mark.parametrize("lengths, max_length, step", [([2500], 3000, 0), ([950], 1000, 300)])
def test_a_captured_key_is_a_grid_length_within_the_capture_limit(lengths, max_length, step):
    counts = modes.offline(lengths, max_batch=1, max_length=max_length, step=step)
    grid = set(modes.length_grid(max_length, step))
    hit = [k for k, n in counts.items() if n]
    assert hit and all(k.length <= max_length and k.length in grid for k in hit if k.captured)
    assert all(k.captured or k.length == lengths[0] for k in hit)  # else eager at its own length


def _gemm_calls(census):
    return sum(p.calls for p in census.points if p.signature.op != "bmm")


def test_fused_census_keys_what_optimize_runs_and_counts_each_linear_once():
    pytest.importorskip("transformers")
    w = workload("whisper-base")  # transformers' modules: the ones optimize() proves fusable
    plain = take_census(w, "offline", max_batch=2, manifest=MANIFEST, impl="hf")
    fused = take_census(w, "offline", max_batch=2, manifest=MANIFEST, impl="hf", fused=True)
    sigs = {p.signature.format() for p in fused.points if p.signature.op != "bmm"}
    # fc1 + GELU is one gemm_act call with its bias; a biased Linear alone is gemm_act act=none;
    # whisper's k_proj has no bias: a plain gemm
    assert "gemm|op=gemm_act|dt=half|N=2048|K=512|act=gelu|bias=1" in sigs
    assert "gemm|op=gemm_act|dt=half|N=512|K=2048|act=none|bias=1" in sigs
    assert "gemm|op=gemm|dt=half|N=512|K=512" in sigs
    assert not any(s.startswith("gemm|op=gemm|dt=half|N=2048|K=512") for s in sigs)
    assert _gemm_calls(fused) == _gemm_calls(plain)  # the tuned op's own fallback is not counted again
    bmm = lambda c: sorted((p.signature.format(), p.m, p.calls) for p in c.points if p.signature.op == "bmm")  # noqa: E731
    assert bmm(fused) == bmm(plain)
    assert dict(fused.meta)["fused"] == "yes" and dict(plain.meta)["fused"] == "no"


def test_fused_census_of_a_causal_lm_runner_fuses_gate_and_silu():
    pytest.importorskip("transformers")
    census = take_census(workload("llama-3-8b"), "decode", max_batch=2, impl="hf", fused=True)
    sigs = {p.signature.format() for p in census.points}
    assert "gemm|op=gemm_act|dt=half|N=14336|K=4096|act=silu|bias=0" in sigs
    assert "gemm|op=gemm|dt=half|N=128256|K=4096" in sigs  # the LM head


def test_fused_census_needs_a_module():
    def build(device, impl):
        return Built(lambda x: x, lambda b, length: (None,), None, "user")

    w = Workload("callable", AUDIO, build, max_length=400, length_step=200)
    with pytest.raises(CensusError, match=r"the fused census \(--fused, tune.s default\) needs the model to be a torch.nn.Module"):
        take_census(w, "offline", max_batch=1, manifest=MANIFEST, fused=True)
