"""The arch profile measured by the measuring worker (build/speculative.py's ProfileRequest, what a
cold `tunedb tune` measures beside its census): this GPU's profile, cached where the build reads
it, and the same device limits as measured in this process. About 10-15 s on one H200."""
import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu


def test_the_worker_measures_and_caches_the_profile_the_build_reads(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    from tunedb import arch, settings
    from tunedb.build.speculative import ProfileRequest
    from tunedb.measure.worker import Worker
    from tunedb.records import Status

    with settings.override(CACHE_DIR=str(tmp_path / "cache")):
        sku = arch.queried()["sku"]
        assert not arch.cache_path(sku).exists()
        worker = Worker()
        try:
            res = worker.run(ProfileRequest(), timeout_s=120)
        finally:
            worker.close()
        assert res.status is Status.OK, res.detail
        profile = res.value
        assert profile.sku == sku and profile.source.startswith("measured")
        assert profile.dram_bw_gbs > 0 and profile.bf16_tflops > 0 and profile.launch_us_eager > 0
        assert arch.load_profile(arch.cache_path(sku)) == profile  # cached: this process reads it
        here = arch.queried()
        assert (profile.arch_family, profile.sms, profile.smem_per_block) == \
            (here["arch_family"], here["sms"], here["smem_per_block"])
