"""The launch table: one resolution per (epoch, shape), epochs, overrides, recording."""
from __future__ import annotations

import torch

from runtime_fakes import gemm  # noqa: F401  (fixture)
from tunedb import database
from tunedb.runtime import selector
from tunedb.records import Entry, Region
from tunedb.runtime import launch_table


def _tensors(m=4, n=64, k=32, bias=True, dtype=torch.bfloat16):
    x = torch.randn(m, k, dtype=dtype)
    w = torch.randn(n, k, dtype=dtype)
    b = torch.randn(n, dtype=dtype) if bias else None
    return x, w, b


def test_one_resolution_and_one_launcher_per_shape(gemm):
    x, w, b = _tensors()
    first = launch_table.launcher("gemm_act", x, w, b, "gelu", 4)
    again = launch_table.launcher("gemm_act", x, w, b, "gelu", 4)
    assert first is again and again.calls == 2
    assert first.tier == "default" and str(first.signature) == "gemm|op=gemm_act|dt=bf16|N=64|K=32|act=gelu|bias=1"
    x8 = torch.randn(2, 4, 32, dtype=torch.bfloat16)  # M counts every leading dim
    other = launch_table.launcher("gemm_act", x8, w, b, "gelu", 8)
    assert other is not first and other.m == 8
    assert len(gemm.built) == 2
    out = first.call(x, w, b, None)
    torch.testing.assert_close(out, torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b)))


def test_dtype_activation_and_bias_are_part_of_the_key(gemm):
    x, w, b = _tensors()
    a = launch_table.launcher("gemm_act", x, w, b, "gelu", 4)
    assert launch_table.launcher("gemm_act", x, w, b, "silu", 4) is not a
    assert launch_table.launcher("gemm_act", x, w, None, "gelu", 4) is not a
    xh, wh, bh = x.half(), w.half(), b.half()
    assert launch_table.launcher("gemm_act", xh, wh, bh, "gelu", 4).signature.dt == "fp16"


def test_selection_changes_only_at_a_new_epoch(gemm, tiers_dirs):
    x, w, _ = _tensors(m=16, bias=False)
    before = launch_table.launcher("gemm", x, w, None, "none", 16)
    assert before.tier == "default"
    sig = before.signature
    cfg = gemm.parse_config("b32x64x128_w4_s3_g8")
    database.write_entries("user", "gemm", "sm90", [Entry(sig, (Region(64, cfg.id),))], [cfg])
    # the user tier changed on disk mid-process: nothing changes until reload()
    same = launch_table.launcher("gemm", x, w, None, "none", 16)
    assert same is before and same.config.id != cfg.id
    selector.reload()
    after = launch_table.launcher("gemm", x, w, None, "none", 16)
    assert after is not before
    assert (after.tier, after.config.id) == ("user", cfg.id)
    above = launch_table.launcher("gemm", torch.randn(65, 32, dtype=torch.bfloat16), w, None, "none", 65)
    assert above.tier == "default"  # regions round up: 64 does not serve 65


def test_an_override_answers_first_and_is_forgotten_on_exit(gemm):
    x, w, b = _tensors()
    cfg = gemm.parse_config("b16x64x256_w4_s3_g8")
    seen = []

    def override(family, sig, m):
        seen.append((sig.op, m))
        return (cfg, "autotune") if m == 4 else None

    plain = launch_table.launcher("gemm_act", x, w, b, "relu", 4)
    with launch_table.overriding(override):
        inside = launch_table.launcher("gemm_act", x, w, b, "relu", 4)
        assert (inside.tier, inside.config.id) == ("autotune", cfg.id)
        x5 = torch.randn(5, 32, dtype=torch.bfloat16)
        assert launch_table.launcher("gemm_act", x5, w, b, "relu", 5).tier == "default"
    assert seen == [("gemm_act", 4), ("gemm_act", 5)]
    outside = launch_table.launcher("gemm_act", x, w, b, "relu", 4)
    assert outside.tier == plain.tier == "default" and outside is not inside


def test_recording_collects_every_call(gemm):
    from tunedb.families.gemm import ops

    x, w, b = _tensors()
    with launch_table.recording() as calls:
        ops.gemm_act(x, w, b, "gelu")
        ops.gemm_act(x, w, b, "gelu")
        ops.gemm(x.view(2, 2, 32), w)
    assert [(fam, str(sig), m) for fam, sig, m in calls] == [
        ("gemm", "gemm|op=gemm_act|dt=bf16|N=64|K=32|act=gelu|bias=1", 4),
        ("gemm", "gemm|op=gemm_act|dt=bf16|N=64|K=32|act=gelu|bias=1", 4),
        ("gemm", "gemm|op=gemm|dt=bf16|N=64|K=32", 4),
    ]
    assert not launch_table.recording_active()


def test_tunedb_capture_records_each_new_shape_and_its_first_captured_call(gemm, tmp_path, monkeypatch):
    from tunedb import settings
    from tunedb.census.capture import read_capture

    path = tmp_path / "capture.jsonl"
    x, w, b = _tensors()
    with settings.override(CAPTURE=str(path)):
        launch_table.clear()
        for _ in range(3):
            launch_table.launcher("gemm_act", x, w, b, "silu", 4)
        x8 = torch.randn(8, 32, dtype=torch.bfloat16)
        launch_table.launcher("gemm", x8, w, None, "none", 8)
        monkeypatch.setattr(launch_table, "_capturing", lambda: True)
        launch_table.launcher("gemm", x8, w, None, "none", 8)
        launch_table.launcher("gemm", x8, w, None, "none", 8)
    assert len(path.read_text().splitlines()) == 3
    points = {(str(p.signature), p.m): p for p in read_capture(path).points}
    assert set(points) == {("gemm|op=gemm_act|dt=bf16|N=64|K=32|act=silu|bias=1", 4),
                           ("gemm|op=gemm|dt=bf16|N=64|K=32", 8)}
    assert points[("gemm|op=gemm|dt=bf16|N=64|K=32", 8)].must_tune
    assert not points[("gemm|op=gemm_act|dt=bf16|N=64|K=32|act=silu|bias=1", 4)].must_tune


def test_a_config_failing_on_its_first_call_is_replaced_by_the_torch_arm(gemm, monkeypatch):
    import pytest

    from tunedb.errors import TunedbWarning

    real = gemm.launcher

    def broken(config, sig):
        if config.id != "torch":
            def fail(*args):
                raise RuntimeError("out of resources: shared memory")
            return fail
        return real(config, sig)

    x, w, b = _tensors()
    # a measured Triton pick (an unmeasured shape gets the torch arm: nothing would fail)
    sig = launch_table.launcher("gemm_act", x, w, b, "gelu", 4).signature
    cfg = gemm.parse_config("b32x64x128_w4_s3_g8")
    database.write_entries("user", "gemm", "sm90", [Entry(sig, (Region(None, cfg.id),))], [cfg])
    selector.reload()
    monkeypatch.setattr(gemm, "launcher", broken)
    bound = launch_table.launcher("gemm_act", x, w, b, "gelu", 4)
    assert bound.config.id == cfg.id
    with pytest.warns(TunedbWarning, match="failed on its first call.*out of resources.*torch arm"):
        out = launch_table.first_launch(bound, x, w, b)
    torch.testing.assert_close(out, torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b)))
    assert bound.config.id == "torch" and launch_table.launcher("gemm_act", x, w, b, "gelu", 4) is bound


def test_every_call_is_counted_per_tier_by_the_selector(gemm):
    from tunedb.runtime import selector
    selector.reset_counters()
    x, w, b = _tensors()
    for _ in range(5):
        bound = launch_table.launcher("gemm_act", x, w, b, "gelu", 4)
    assert bound.calls == 5
    assert selector.counters()["gemm"]["calls"] == 5  # one counter, the selector's, per call
    assert selector.counters()["gemm"]["tiers"][bound.tier] == 5


def test_the_call_memo_holds_only_calls_nobody_observes_and_empties_at_a_new_epoch(gemm, tmp_path):
    x, w, _ = _tensors(m=8, bias=False)
    bound = launch_table.launcher("gemm", x, w, None, "none", 8)
    key = ("gemm", "none", x.shape, x.dtype, w.shape, w.dtype, None)
    launch_table.remember(key, bound)
    assert launch_table.known(key) is bound
    selector.reload()  # tunedb.reload(): a new epoch empties it before any call sees it
    assert launch_table.known(key) is None
    bound = launch_table.launcher("gemm", x, w, None, "none", 8)
    launch_table.remember(key, bound)
    with launch_table.recording() as sink:  # a recorder must see every call: memo off inside
        assert launch_table.known(key) is None
        launch_table.remember(key, bound)
        assert launch_table.known(key) is None
        launch_table.record("gemm", x, w, None, "none")
    assert len(sink) == 1
    launch_table.remember(key, bound)
    with launch_table.overriding(lambda family, sig, m: None):
        assert launch_table.known(key) is None


def test_the_call_memo_is_off_while_tunedb_capture_records(gemm, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEDB_CAPTURE", str(tmp_path / "cap.jsonl"))
    launch_table.clear()
    x, w, _ = _tensors(m=8, bias=False)
    bound = launch_table.launcher("gemm", x, w, None, "none", 8)
    key = ("gemm", "none", x.shape, x.dtype, w.shape, w.dtype, None)
    launch_table.remember(key, bound)
    assert launch_table.known(key) is None


def test_a_launcher_of_a_past_epoch_is_never_remembered(gemm):
    x, w, _ = _tensors(m=8, bias=False)
    old = launch_table.launcher("gemm", x, w, None, "none", 8)
    selector.reload()  # another thread starts a new epoch between the lookup and remember()
    key = ("gemm", "none", x.shape, x.dtype, w.shape, w.dtype, None)
    launch_table.remember(key, old)
    assert launch_table.known(key) is None
    new = launch_table.launcher("gemm", x, w, None, "none", 8)
    launch_table.remember(key, new)
    assert launch_table.known(key) is new


def test_a_decode_region_serves_the_sizes_it_was_measured_at(gemm, tiers_dirs):
    """A triton_decode config is valid only at M <= 16: the selector judges a region's config at
    the call's size, so a measured decode region serves M <= 16 (it used to be skipped as
    'invalid for every M') and a larger M falls through to the next region."""
    x, w, _ = _tensors(m=8, n=64, k=256, bias=False)
    sig = launch_table.launcher("gemm", x, w, None, "none", 8).signature
    cfg = gemm.parse_config("dk1_n64x128_w4_s4")
    database.write_entries("user", "gemm", "sm90", [Entry(sig, (Region(16, cfg.id), Region(None, "torch")))], [cfg])
    selector.reload()
    small = launch_table.launcher("gemm", x, w, None, "none", 8)
    assert (small.tier, small.config.id) == ("user", cfg.id)
    big = launch_table.launcher("gemm", torch.randn(32, 256, dtype=torch.bfloat16), w, None, "none", 32)
    assert (big.tier, big.config.id) == ("user", "torch")
