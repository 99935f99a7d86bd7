"""The `gv` GEMV configs as an arm of the GEMM family: the family's one validity predicate (M, the
FMA path's rules, dtype, splits, PDL's arch; every epilogue served), candidate generation, the
cost model's gv term and the build's seeds, a build through a fake timer whose table serves a gv
config and the selector serving it, and the kernel through the family's launcher under the Triton
interpreter against an fp32 reference (a child process: TRITON_INTERPRET before triton loads).
"""
import sys

import pytest

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import interpret_child  # noqa: E402
from decode_interp_checks import arches, sig  # noqa: E402

from tunedb import database, pipeline, settings
from tunedb.database import tiers
from tunedb.families.gemm import FAMILY, calibration, configs, configs_gemv, costmodel
from tunedb.measure.timers import FakeTimer
from tunedb.records import Measurement, Point, ShapeSet, Signature, Status
from tunedb.runtime import selector

SM90, SM80 = arches()
FMA = ("gv1_n16x256_w4_s5_lr", "gv1_n8x512_w4_s5_lr", "gv4_n16x256_w4_s5_lr")
MMA = ("gv1_n32x256_w4_s4_mma", "gv1_n64x256_w4_s3_mma", "gv4_n32x256_w4_s4_mma", "gv1_n16x256_w1_s5_mma")


def gv_ids(configs_):
    return sorted(c.id for c in configs_ if configs_gemv.is_gemv(c))


def test_space_holds_the_seven_gv_configs_and_they_parse_through_the_family():
    assert gv_ids(FAMILY.config_space("sm90")) == sorted(FMA + MMA)
    for cid in FMA + MMA:
        cfg = FAMILY.parse_config(cid)
        assert cfg.lane == "triton_decode" and configs.from_json(cid, cfg.to_json()) == cfg
    # PDL twins parse (the run time launches a served config's twin where a captured call follows
    # one of ours: runtime/capture_chain.py) but stay out of the space, as the dk lane's do
    assert FAMILY.parse_config("gv1_n16x256_w4_s5_lr_pdl").param("pdl") is True
    assert FAMILY.parse_config("gv1_n8x256_w4_s5_lr_p4_pdl").param("pre") == 4
    assert not any(c.param("pdl") for c in FAMILY.config_space("sm90"))


def test_predicate_m_range_and_the_fma_rules():
    s = sig(4096, 4096)
    for cid in MMA:
        cfg = FAMILY.parse_config(cid)
        assert all(FAMILY.invalid_reason(cfg, s, m, SM90) is None for m in range(1, 17))
        assert "1 <= M <= 16, not M=17" in FAMILY.invalid_reason(cfg, s, 17, SM90)
        assert "not every M" in FAMILY.invalid_reason(cfg, s, None, SM90)
    for cid in FMA:
        cfg = FAMILY.parse_config(cid)
        assert all(FAMILY.invalid_reason(cfg, s, m, SM90) is None for m in range(1, 5))
        assert "FMA path serves M <= 4, not M=5" in FAMILY.invalid_reason(cfg, s, 5, SM90)
    # the product tile's registers: 16 x 512 at M=3 pads to 4 rows, 256 registers a thread
    wide = FAMILY.parse_config("gv1_n16x512_w4_s5_lr")
    assert FAMILY.invalid_reason(wide, s, 2, SM90) is None
    assert "needs 256 registers a thread at M=3" in FAMILY.invalid_reason(wide, s, 3, SM90)
    assert "M=0" in FAMILY.invalid_reason(wide, s, 0, SM90)


def test_predicate_splits_dtypes_epilogues_and_pdl():
    split = FAMILY.parse_config("gv4_n32x256_w4_s4_mma")
    assert "split_k=4 > 2 K tiles of 256 at K=512" in FAMILY.invalid_reason(split, sig(2048, 512), 1, SM90)
    assert FAMILY.invalid_reason(split, sig(80, 256 * 3 + 8), 1, SM90) is None  # 4 tiles, the last ragged
    # every dtype key the family has (half, fp16, bf16), odd N and K: no alignment rule
    for dt in ("half", "fp16", "bf16"):
        assert FAMILY.invalid_reason(split, sig(4104, 4104, dt=dt), 16, SM90) is None
    assert "serves ('bf16', 'fp16', 'half'), not 'fp32'" in configs_gemv.gemv_reason(split, 64, 64, 1, "fp32")
    fp32 = Signature.make("gemm", "gemm", "fp32", N=4096, K=4096)
    assert "dtype 'fp32' is not served" in FAMILY.invalid_reason(split, fp32, 1, SM90)
    assert not FAMILY.candidates(fp32, 1, SM90)
    # the kernel's epilogue runs bias and every activation of the family: gemm_act keys are served
    for act in configs.ACTS:
        for bias in (False, True):
            s = sig(4096, 4096, "gemm_act", act, bias)
            assert gv_ids(FAMILY.candidates(s, 1, SM90)) == sorted(FMA + MMA), (act, bias)
    pdl = FAMILY.parse_config("gv1_n16x256_w4_s5_lr_pdl")
    assert "sm90 or newer" in FAMILY.invalid_reason(pdl, sig(), 1, SM80)
    assert FAMILY.invalid_reason(FAMILY.parse_config(FMA[0]), sig(), 1, SM80) is None


@pytest.mark.parametrize("n,k,counts", [
    (4096, 4096, {1: 7, 2: 7, 3: 7, 4: 7, 5: 4, 8: 4, 16: 4, 17: 0, 64: 0}),
    (2048, 512, {1: 5, 4: 5, 5: 3, 16: 3, 17: 0}),  # K=512: two tiles of 256, no split 4
])
def test_candidates_gain_gv_at_decode_sizes_only(n, k, counts):
    s = sig(n, k)
    assert {m: len(gv_ids(FAMILY.candidates(s, m, SM90))) for m in counts} == counts
    assert gv_ids(FAMILY.candidates(s, None, SM90)) == []


def test_cost_model_prices_gv_at_its_measured_rate_and_the_build_always_measures_it():
    # session 16 C (BENCHMARKS.md): gv1_n16x256_w4_s5_lr at M=1, cold, CUDA graphs (us)
    measured = {(6144, 4096): 15.48, (4096, 4096): 11.24, (28672, 4096): 59.57, (4096, 14336): 30.29}
    for (n, k), us in measured.items():
        ms = costmodel.predict(FAMILY.parse_config(FMA[0]), (sig(n, k), 1), SM90)
        assert abs(ms * 1e3 / us - 1) < 0.15, (n, k, ms * 1e3, us)
    # 64-row slabs at N=4096 fill 64 of 132 SMs: slower than 32-row slabs on the same weight
    s = sig(4096, 14336)
    wide, narrow = (costmodel.predict(FAMILY.parse_config(c), (s, 8), SM90) for c in MMA[1::-1])
    assert wide > 1.1 * narrow
    # the FMA path's issue time grows with M's padded rows; the tensor-core path's does not
    fma = [costmodel.predict(FAMILY.parse_config(FMA[1]), (sig(28672, 4096), m), SM90) for m in (1, 4)]
    mma = [costmodel.predict(FAMILY.parse_config(MMA[1]), (sig(28672, 4096), m), SM90) for m in (1, 16)]
    assert fma[1] > 1.2 * fma[0] and mma[0] == mma[1]
    assert costmodel.predict(FAMILY.parse_config(MMA[0]), (sig(), 17), SM90) is Status.INFEASIBLE
    model = FAMILY.cost_model(SM90, None)
    s = sig(4096, 4096)
    for m, want in ((1, 7), (14, 4), (17, 0)):
        cands = FAMILY.candidates(s, m, SM90)
        ranked = model.rank(s, m, cands, 2)
        top = [c.id for c, _ in costmodel.rank(cands, m, 4096, 4096, SM90, 2, None, None, dt=s.dt, sig=s)]
        assert ranked[:2] == top and len(ranked) == len(set(ranked))
        assert len([c for c in ranked if c.startswith("gv")]) == want, (m, ranked)


def test_calibration_leaves_gv_to_its_own_term():
    rows, by_id = [], {c: FAMILY.parse_config(c) for c in ("gv1_n32x256_w4_s4_mma", "b16x64x256_w4_s3_g8",
                                                            "b64x64x64_w4_s3_g8", "torch")}
    for n in (1024, 4096, 14336):
        for m in (1, 4, 16, 256, 2048):
            for cid, us in (("gv1_n32x256_w4_s4_mma", 3 + n / 400), ("b16x64x256_w4_s3_g8", 4 + n * m / 3e3),
                            ("b64x64x64_w4_s3_g8", 5 + n * m / 5e3), ("torch", 4 + n * m / 6e3)):
                if cid.startswith("gv") and m > 16:
                    continue
                rows.append(Measurement(sig(n, 4096), m, cid, Status.OK, us / 1e3, 0.0, 5))
    with_gv = calibration.fit(rows, by_id, SM90)
    without = calibration.fit([r for r in rows if not r.config_id.startswith("gv")], by_id, SM90)
    assert with_gv.per_config and not any(c.startswith("gv") for c in with_gv.per_config)
    # gv rows move nothing the tile model fits (lines, scale, vendor level, decode law)
    for field in ("per_config", "scale", "sentinel", "decode", "kernel_us"):
        assert getattr(with_gv, field) == getattr(without, field), field
    gv = by_id["gv1_n32x256_w4_s4_mma"]
    assert costmodel.predict(gv, (sig(), 4), SM90, with_gv) == costmodel.predict(gv, (sig(), 4), SM90)


DECODE = Signature.make("gemm", "gemm", "half", N=1024, K=1024)
DECODE_ACT = Signature.make("gemm", "gemm_act", "half", N=1024, K=1024, act="silu", bias=1)


SEEN: list = []


def _truth(s: Signature, m: int, cid: str) -> float:
    """torch 10 us; the gv configs 6 us (at M <= 16, their only sizes); every other arm 11 us."""
    SEEN.append((s, m, cid))
    if cid == "torch":
        return 0.010
    offset = (sum(map(ord, cid)) % 7) * 1e-5  # distinct, stable, small
    return (0.006 if cid.startswith("gv") else 0.011) + offset


def test_a_build_serves_gv_where_it_wins_and_the_selector_resolves_it(tmp_path):
    SEEN.clear()
    timer = FakeTimer(_truth, noise_sigma=0.002, seed=3)
    shapes = ShapeSet(tuple(Point(s, m, weight=1.0, calls=10) for s in (DECODE, DECODE_ACT) for m in (1, 3, 14, 64)))
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), USER_DB=str(tmp_path / "user")):
        pipeline.build([("c", shapes)], pipeline.BuildOptions(out=str(tmp_path / "out"), simulate=False, top_k=4,
                                                              fresh=False, fill=False), timer=timer)
        measured = set(SEEN)
        for s in (DECODE, DECODE_ACT):
            got = {m: sorted(c for ss, mm, c in measured if ss == s and mm == m and c.startswith("gv")) for m in (1, 3, 14, 64)}
            # top-4 of ~60 candidates: the gv configs are measured as the model's seeds at M <= 16
            assert got == {1: sorted(FMA + MMA), 3: sorted(FMA + MMA), 14: sorted(MMA), 64: []}, got
        db = database.load(tmp_path / "out" / "sm90" / "gemm.json", "gemm", "sm90")
        for s in (DECODE, DECODE_ACT):
            regions = db.entries[s].regions
            assert all(r.config_id.startswith("gv") for r in regions[:-1]) and regions[-1].config_id == "torch"
        with tiers.system_root_override(tmp_path / "out"):
            selector.configure("sm90")
            try:
                for m in (1, 2, 3, 14):  # the measured sizes and one between them
                    r = selector.resolve("gemm", DECODE_ACT, m)
                    assert r.tier == "system" and configs_gemv.is_gemv(r.config), (m, r)
                    assert FAMILY.invalid_reason(r.config, DECODE_ACT, m, SM90) is None
                assert selector.resolve("gemm", DECODE, 64).config.id == "torch"
            finally:
                selector.configure()


# (config id, op, N, K, act, bias, Ms) through FAMILY.launch: odd N (40, 72) and K (520, 200), fp16
CASES = [
    ("gv1_n16x256_w4_s5_lr", "gemm", 40, 520, "none", False, (1, 2, 3, 4)),
    ("gv1_n8x512_w4_s5_lr", "gemm_act", 72, 200, "silu", True, (1, 4)),
    ("gv4_n16x256_w4_s5_lr", "gemm_act", 40, 1040, "gelu", True, (1, 3)),
    ("gv1_n32x256_w4_s4_mma", "gemm_act", 40, 520, "relu", True, (1, 5, 16)),
    ("gv4_n32x256_w4_s4_mma", "gemm_act", 72, 1040, "gelu_tanh", False, (2, 9, 16)),
]


def _child() -> None:
    import torch

    from decode_interp_checks import decode_failures

    # the deterministic split-K reduction: same inputs, same bits (M=13: the tensor-core path)
    failures = decode_failures(CASES, det_k=1040, det_cids=("gv4_n32x256_w4_s4_mma",))
    # the FMA path in bf16 (the interpreter's bf16 tl.dot is wrong on this CPU, its FMAs are not),
    # a dt=half key served with bf16 tensors, through the family's cached launcher
    s = FAMILY.make_signature("gemm_act", "half", 40, 1040, "silu", True)
    for m in (1, 3):
        (x, w, b), _ = FAMILY.make_inputs(s, m, "cpu", seed=m)
        x, w, b = x.bfloat16(), w.bfloat16(), b.bfloat16()
        y = FAMILY.launcher(FAMILY.parse_config("gv1_n16x256_w4_s5_lr"), s)(x, w, b, None)
        ref = FAMILY.reference(s, x, w, b)
        err = (y.float() - ref).abs().max().item()
        if y.dtype != torch.bfloat16 or err > 4 * (ref.bfloat16().float() - ref).abs().max().item() + 2e-3:
            failures.append(f"bf16 M={m}: {y.dtype} err {err}")
        split = FAMILY.launcher(FAMILY.parse_config("gv4_n16x256_w4_s5_lr"), s)  # 5 K tiles over 4 splits
        if not torch.equal(split(x, w, b, None), split(x, w, b, None)):
            failures.append(f"gv4 FMA bf16 M={m}: two runs on the same inputs differ")
    try:
        FAMILY.launch(FAMILY.parse_config("gv1_n16x256_w4_s5_lr"), s, x[:1].expand(5, -1).contiguous(), w, b)
        failures.append("the FMA path launched at M=5")
    except ValueError as exc:
        if "M <= 4" not in str(exc):
            failures.append(f"the FMA path at M=5: unclear error {exc}")
    interpret_child.report(failures)


def test_gv_through_the_family_launcher_matches_fp32_under_the_interpreter():
    assert interpret_child.failures(__file__, timeout=600, TRITON_DEFAULT_FP_FUSION="1") == []


if __name__ == "__main__":
    _child()


def test_the_prebuild_plans_gv_binaries_for_decode_signatures():
    from tunedb.families.gemm import compile_jobs, prebuild

    s = sig(4096, 4096, dt="half")
    jobs = prebuild.jobs_for_census([s], "sm90")
    assert {j.config_id for j in jobs if j.config_id.startswith("gv")} == set(FMA + MMA)
    assert {j.dt for j in jobs if j.config_id.startswith("gv")} == {"fp16", "bf16"}
    built = compile_jobs.jobs("sm90", s, ["gv1_n16x256_w4_s5_lr", "torch"], "/tmp/cache")
    assert [(j.job.config_id, j.job.dt) for j in built] == [("gv1_n16x256_w4_s5_lr", "bf16")]


@pytest.mark.slow
def test_the_prebuild_compiles_every_padded_row_count_a_gv_config_launches(tmp_path):
    """A build's compile pool (prebuild.compile_job): the FMA config's binaries at MP = 1, 2, 4 and
    the tensor-core config's at 16, for sm90 without a GPU; a second run compiles nothing."""
    import json
    import os
    import subprocess
    from pathlib import Path

    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "triton"), TRITON_DEFAULT_FP_FUSION="1")
    code = ("from tunedb.families.gemm import prebuild as p; import json;"
            "s = p.run_jobs([p.Job('gv1_n16x256_w4_s5_lr', 'bf16'), p.Job('gv4_n32x256_w4_s4_mma', 'fp16')], 'sm90', 2);"
            "print(json.dumps(s))")

    def run():
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    summary = run()
    assert summary["ok"] == 2, summary["failed"]
    assert len(sorted(Path(tmp_path / "triton").rglob("*.cubin"))) == 4
    entries = sorted(p.name for p in (tmp_path / "triton").iterdir())
    run()
    assert sorted(p.name for p in (tmp_path / "triton").iterdir()) == entries
