"""ArchProfile: shipped loading, the per-SKU cache, the CLI's shipped-format output (device query mocked)."""
import json
from importlib import resources

import pytest

from tunedb import arch, settings
from tunedb.errors import MeasurementError, TunedbError
from tunedb.records import ArchProfile

H200_QUERY = {"arch_family": "sm90", "sku": "NVIDIA H200", "sms": 132, "smem_per_sm": 233472,
              "smem_per_block": 232448, "l2_bytes": 62914560, "regs_per_sm": 65536}


def measured(**over):
    fields = dict(H200_QUERY, dram_bw_gbs=4400.0, bf16_tflops=760.0, fp16_tflops=765.0,
                  launch_us_graph=1.9, launch_us_eager=4.2, source="measured (test)")
    fields.update(over)
    return ArchProfile(**fields)


@pytest.fixture
def fake_h200(tmp_path, monkeypatch):
    monkeypatch.setattr(arch, "queried", lambda device=None: dict(H200_QUERY))
    monkeypatch.setattr(arch, "_MEMO", {})
    calls = []

    def measure(device=None):
        calls.append(device)
        return measured()

    monkeypatch.setattr(arch, "measure_profile", measure)
    with settings.override(CACHE_DIR=str(tmp_path)):
        yield calls


def test_shipped_profile_and_unknown_arch():
    p = arch.shipped_profile("sm90")
    assert p.sku == "NVIDIA H200" and p.l2_bytes == 60 * 2**20 and p.sms == 132
    with pytest.raises(TunedbError, match="sm75.*shipped: sm90"):
        arch.shipped_profile("sm75")


def test_sku_slug_and_cache_path(tmp_path):
    assert arch.sku_slug("NVIDIA H200") == "nvidia-h200"
    assert arch.sku_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    with settings.override(CACHE_DIR=str(tmp_path)):
        assert arch.cache_path("NVIDIA H200") == tmp_path / "arch" / "nvidia-h200.json"
    with pytest.raises(ValueError, match="no characters"):
        arch.sku_slug("  ")


def test_measures_once_then_serves_the_cache(fake_h200, tmp_path):
    first = arch.current_profile(measure=True)
    assert first == measured() and len(fake_h200) == 1
    assert arch.load_profile(tmp_path / "arch" / "nvidia-h200.json") == first
    arch._MEMO.clear()  # a new process: the file answers, nothing is re-measured
    assert arch.current_profile(measure=True) == first and len(fake_h200) == 1
    arch.current_profile(measure=True, refresh=True)
    assert len(fake_h200) == 2


def test_corrupt_cache_is_re_measured_with_a_warning(fake_h200, tmp_path):
    path = tmp_path / "arch" / "nvidia-h200.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"sku": "NVIDIA H200"')
    with pytest.warns(RuntimeWarning, match="unusable"):
        assert arch.current_profile(measure=True) == measured()
    assert arch.load_profile(path) == measured()


def test_without_measuring_queried_fields_take_shipped_ceilings(fake_h200):
    p = arch.current_profile(measure=False)
    assert p.source.startswith("queried") and fake_h200 == []
    assert p.dram_bw_gbs == arch.shipped_profile("sm90").dram_bw_gbs and p.sms == 132


def test_no_gpu_is_a_clear_error():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    with pytest.raises(MeasurementError, match="no CUDA device.*shipped_profile"):
        arch.current_profile()


def test_cli_writes_the_shipped_format(fake_h200, tmp_path, capsys):
    out = tmp_path / "arch_sm90.json"
    assert arch.main(["--measure", "--json", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    written = json.loads(out.read_text())
    shipped = json.loads(resources.files("tunedb.data").joinpath("arch_sm90.json").read_text())
    assert list(written) == list(shipped)  # same keys, same order: a drop-in replacement
    assert written == printed == measured().to_json()
    assert arch.main(["--shipped", "sm90"]) == 0
    assert "% of the published 4800" in capsys.readouterr().out
    assert arch.main(["--shipped", "sm12"]) == 2


def test_profile_peaks_for_other_dtypes_round_trip():
    from dataclasses import replace

    base = arch.shipped_profile("sm90")
    prof = replace(base, peaks=(("fp64", 60.0), ("int8", 1800.0)))
    again = type(base).from_json(json.loads(json.dumps(prof.to_json())))
    assert again == prof and again.peak_tflops("int8") == 1800.0
    assert base.peak_tflops("fp64") == base.bf16_tflops and base.peak_tflops("fp16") == base.fp16_tflops
    assert "peaks" not in base.to_json()
