"""`tunedb tune`: without a GPU it prints the plan and measures nothing; with --simulate it runs
the whole chain (census -> build into the user tier -> evaluate) on the CPU."""
from __future__ import annotations

import pytest

from tunedb import database, pipeline, settings
from tunedb.cli import main
from tunedb.errors import DatabaseError
from tunedb.records import Point, ShapeSet, Signature

QKV = Signature.make("gemm", "gemm", "half", N=512, K=512)
FFN = Signature.make("gemm", "gemm", "half", N=2048, K=512)
# what `tunedb tune` censuses by default: the calls tunedb.optimize(model) makes (fc1 + GELU fused)
FFN_FUSED = Signature.make("gemm", "gemm_act", "half", N=2048, K=512, act="gelu", bias=1)
BMM = Signature.make("gemm", "bmm", "half", B=8, N=64, K=1500)


@pytest.fixture
def tiers(tmp_path):
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), USER_DB=str(tmp_path / "user")):
        yield tmp_path


def test_tune_whisper_base_without_a_gpu_prints_the_plan(tiers, monkeypatch, capsys):
    monkeypatch.setattr(pipeline, "has_gpu", lambda: False)
    monkeypatch.setenv("COLUMNS", "200")  # one table row per line
    (tiers / "empty-system").mkdir()
    with database.system_root_override(tiers / "empty-system"):  # no entry: the model answers
        assert main(["tune", "whisper-base"]) == 0
    out = capsys.readouterr().out
    assert "No GPU: nothing was measured." in out
    assert "census of whisper-base" in out and "what tunedb would serve on sm90" in out
    assert "points per tier:" in out
    ffn = [line for line in out.splitlines() if FFN_FUSED.format() + " " in line]
    assert len(ffn) == 4 and all(" model " in line for line in ffn)  # the FFN up-projection at 4 Ms
    assert not (tiers / "user").exists()  # nothing measured, nothing written
    assert not (tiers / "cache" / "runs").exists()


def test_the_shipped_system_tier_serves_whisper_base_on_sm90(tiers, monkeypatch, capsys):
    monkeypatch.setattr(pipeline, "has_gpu", lambda: False)
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["tune", "whisper-base", "--arch", "sm90"]) == 0
    out = capsys.readouterr().out
    for sig in (QKV, FFN_FUSED):
        rows = [line for line in out.splitlines() if sig.format() + " " in line]
        assert len(rows) == 4 and all(" system " in line for line in rows)
    assert "No GPU: nothing was measured." in out


def test_served_plan_names_each_points_tier(tiers):
    system = tiers / "system"
    entry = {"regions": [[None, "torch"]], "source": "build"}
    (system / "sm90").mkdir(parents=True)
    (system / "sm90" / "gemm.json").write_text(
        '{"schema": 1, "kernel_family": "gemm", "arch_family": "sm90", "validators": {}, "configs": {}, '
        '"entries": {"%s": %s}}' % (QKV.format(), str(entry).replace("'", '"').replace("None", "null")))
    shapes = ShapeSet((Point(QKV, 1500), Point(FFN, 1500), Point(BMM, 1500)))
    with database.system_root_override(system), settings.override(MODEL_FALLBACK="auto"):
        served = {(s.point.signature, s.tier): s.config_id for s in pipeline.plan_served(shapes, "sm90")}
        assert served[(QKV, "system")] == "torch"
        assert (FFN, "model") in served and served[(FFN, "model")] != "default"
        assert served[(BMM, "unserved")] == "-"
        with settings.override(MODEL_FALLBACK="0"):
            served = {(s.point.signature, s.tier) for s in pipeline.plan_served(shapes, "sm90")}
        assert (FFN, "default") in served


def test_simulated_tune_runs_the_chain_into_a_named_directory(tiers):
    shapes = ShapeSet((Point(QKV, 16, 0.5, 10), Point(QKV, 40, 0.5, 10), Point(BMM, 16, 0.0, 1)))
    opts = pipeline.BuildOptions(out=str(tiers / "sim"), simulate=True, top_k=4)
    res = pipeline.tune("toy", opts, shapes=shapes)
    assert res.measured and res.build is not None
    path = tiers / "sim" / "sm90" / "gemm.json"
    assert res.build.path == path
    db = database.load(path)
    assert set(db.entries) == {QKV}  # bmm is not an op of the gemm family: skipped, said so
    assert res.build.skipped == (BMM.format(),)
    ev = res.evaluation
    assert ev is not None and {s.name for s in ev.summaries} == {"default", "torch", "cost model", "tuned"}
    # the tuned file's pick was measured at every point, and never loses to torch by the gate
    tuned, torch = ev.summary("tuned"), ev.summary("torch")
    assert tuned.unmeasured == 0 and tuned.geomean <= torch.geomean + 1e-9
    # --out DIR: the log lives beside the file
    assert res.build.log_path == tiers / "sim" / "measurements.jsonl"
    assert not (tiers / "user").exists()


def test_build_with_user_tier_off_explains(tmp_path):
    from tunedb.measure.timers import FakeTimer

    with settings.override(CACHE_DIR=str(tmp_path), USER_DB="off"):
        shapes = ShapeSet((Point(QKV, 16),))
        with pytest.raises(DatabaseError, match="user tier is disabled"):
            pipeline.build([("toy", shapes)], pipeline.BuildOptions(out="user", top_k=2),
                           timer=FakeTimer(lambda sig, m, cid: 0.01))


def test_tune_measures_a_smaller_top_k_than_a_system_build():
    """On-demand tuning trades the last 0.1% of regret for ~40% fewer arms (BENCHMARKS.md,
    bench/topk_regret.py); a system-tier build keeps 16. An explicit --top-k wins in both."""
    from tunedb.cli import build_parser
    from tunedb.commands.build import options_from

    tune = build_parser().parse_args(["tune", "whisper-base"])
    build = build_parser().parse_args(["build", "--census", "c.json", "--out", "user"])
    assert (options_from(tune).top_k, options_from(build).top_k) == (8, 16)
    assert options_from(build_parser().parse_args(["tune", "whisper-base", "--top-k", "12"])).top_k == 12


class PrestartSpy:
    def __init__(self):
        self.closed = 0

    def close(self, wait=True):
        self.closed += 1


def test_on_a_gpu_the_worker_starts_before_the_census_and_the_build_takes_it(tiers, monkeypatch):
    from tunedb.build import steps as buildsteps
    order, spy = [], PrestartSpy()
    monkeypatch.setattr(pipeline, "has_gpu", lambda: True)
    monkeypatch.setattr(buildsteps, "start_worker", lambda opts, gpu: order.append(("start", gpu)) or spy)
    monkeypatch.setattr(pipeline, "take_census", lambda w, **kw: order.append("census") or
                        ShapeSet((Point(QKV, 16, 1.0, 10),)))
    monkeypatch.setattr(pipeline, "build", lambda censuses, opts, reporter=None, worker=None:
                        order.append(("build", worker)) or pipeline.BuildResult(()))
    pipeline.tune("toy", pipeline.BuildOptions(out="user"))
    assert order == [("start", True), "census", ("build", spy)]
    assert spy.closed == 1  # closed when the build is done (idempotent after the build's own close)

    def refused(censuses, opts, reporter=None, worker=None):
        raise DatabaseError("user tier is off")

    monkeypatch.setattr(pipeline, "build", refused)
    with pytest.raises(DatabaseError):
        pipeline.tune("toy", pipeline.BuildOptions(out="user"))
    assert spy.closed == 2  # a build that fails before measuring leaves no worker running


@pytest.mark.parametrize("opts, gpu", [
    (pipeline.BuildOptions(out="user"), False),
    (pipeline.BuildOptions(out="user", dry_run=True), True),
    (pipeline.BuildOptions(out="user", simulate=True), True),
    (pipeline.BuildOptions(out="user", isolate=False), True),
])
def test_no_worker_is_started_where_nothing_is_measured_in_one(opts, gpu):
    from tunedb.build import steps as buildsteps
    assert buildsteps.start_worker(opts, gpu) is None


def _fake_census_and_tune(monkeypatch, order):
    """The census and the tune as stand-ins that record when they ran (and the worker tune got)."""
    monkeypatch.setattr(pipeline, "take_census", lambda w, **kw: order.append("census") or
                        ShapeSet((Point(QKV, 16, 1.0, 10),)))

    def fake_tune(workload, opts, shapes=None, reporter=None, worker=None):
        order.append(("tune", worker))
        return pipeline.TuneResult(shapes)

    monkeypatch.setattr(pipeline, "tune", fake_tune)


def test_the_cli_starts_the_worker_before_its_census_and_hands_it_to_the_tune(tiers, monkeypatch, capsys):
    from tunedb.build import steps as buildsteps
    order, spy = [], PrestartSpy()
    monkeypatch.setattr(pipeline, "has_gpu", lambda: True)
    monkeypatch.setattr(buildsteps, "start_worker", lambda opts, gpu: order.append("start") or spy)
    _fake_census_and_tune(monkeypatch, order)
    assert main(["tune", "whisper-base"]) == 0
    assert order == ["start", "census", ("tune", spy)]


def test_the_cli_tune_skips_the_cross_calls_second_torch_and_build_keeps_it(tiers, monkeypatch):
    """`tunedb tune` puts its wall time first (BuildOptions.pair_cross); a build keeps pairing."""
    from tunedb.build import steps as buildsteps
    seen = []
    monkeypatch.setattr(pipeline, "has_gpu", lambda: True)
    monkeypatch.setattr(buildsteps, "start_worker", lambda opts, gpu: None)
    monkeypatch.setattr(pipeline, "take_census", lambda w, **kw: ShapeSet((Point(QKV, 16, 1.0, 10),)))
    monkeypatch.setattr(pipeline, "tune", lambda workload, opts, shapes=None, reporter=None, worker=None:
                        seen.append(opts) or pipeline.TuneResult(shapes))
    assert main(["tune", "whisper-base"]) == 0
    assert seen and seen[0].pair_cross is False
    assert pipeline.BuildOptions().pair_cross is True


class StartSpy:
    """start_worker's stand-in: records each call (and whether has_gpu had been asked yet) and
    hands out a PrestartSpy where a real one would start a worker."""

    def __init__(self, order):
        self.order, self.workers = order, []

    def __call__(self, opts, gpu):
        self.order.append(("start", gpu))
        if not gpu:
            return None
        self.workers.append(PrestartSpy())
        return self.workers[-1]


def _until_census(order):
    return order[:order.index("census") + 1]


def _cli_tune_with(monkeypatch, order, likely, gpu):
    from tunedb.build import compile_pool, speculative
    from tunedb.build import steps as buildsteps

    start = StartSpy(order)
    monkeypatch.setattr(buildsteps, "gpu_likely", lambda: likely)
    monkeypatch.setattr(buildsteps, "start_worker", start)
    monkeypatch.setattr(pipeline, "has_gpu", lambda: order.append("has_gpu") or gpu)
    monkeypatch.setattr(compile_pool, "release", lambda family: order.append(("release", family.name)))
    monkeypatch.setattr(speculative, "start", lambda workload, opts, kw, worker=None: order.append(("ahead", kw["impl"])))
    _fake_census_and_tune(monkeypatch, order)
    assert main(["tune", "whisper-base"]) == 0
    return start


def test_the_worker_starts_on_the_drivers_word_before_torch_is_imported_to_ask_cuda(tiers, monkeypatch):
    """The worker's (and the pool's) start is the first thing tune does on a GPU host: before
    has_gpu() (this process's torch import, seconds) and before the census."""
    order = []
    start = _cli_tune_with(monkeypatch, order, likely=True, gpu=True)
    spy = start.workers[0]
    # compiles start from a mirror census's plan before the census asked for
    assert _until_census(order) == [("start", True), "has_gpu", ("ahead", "auto"), "census"]
    assert order[-2:] == [("tune", spy), ("release", "gemm")] and spy.closed == 0  # the build owns it now


def test_a_worker_started_on_a_wrong_guess_is_stopped_with_its_pool(tiers, monkeypatch, capsys):
    order = []
    start = _cli_tune_with(monkeypatch, order, likely=True, gpu=False)
    assert _until_census(order) == [("start", True), "has_gpu", ("release", "gemm"), "census"]
    assert order[-2] == ("tune", None)
    assert start.workers[0].closed == 1
    assert "No GPU" in capsys.readouterr().out


def test_a_gpu_the_guess_missed_still_gets_its_worker_before_the_census(tiers, monkeypatch):
    order = []
    start = _cli_tune_with(monkeypatch, order, likely=False, gpu=True)
    assert _until_census(order) == [("start", False), "has_gpu", ("start", True), ("ahead", "auto"), "census"]
    assert order[-2] == ("tune", start.workers[0])


@pytest.mark.parametrize("proc_gpus, dev_nodes, visible, expected", [
    (["0000:01:00.0"], [], None, True),
    ([], ["nvidiactl", "nvidia0"], None, True),
    ([], ["nvidiactl", "nvidia-uvm"], None, False),  # the driver, but no GPU node
    ([], [], None, False),
    (["0000:01:00.0"], ["nvidia0"], "", False),  # CUDA_VISIBLE_DEVICES hides every GPU
    (["0000:01:00.0"], ["nvidia0"], "-1", False),
    (["0000:01:00.0"], ["nvidia0"], "1", True),
])
def test_gpu_likely_reads_the_driver_without_importing_torch(tmp_path, monkeypatch, proc_gpus, dev_nodes,
                                                             visible, expected):
    from tunedb.build import steps as buildsteps

    proc, dev = tmp_path / "gpus", tmp_path / "dev"
    dev.mkdir()
    if proc_gpus:
        proc.mkdir()
        for name in proc_gpus:
            (proc / name).mkdir()
    for name in dev_nodes:
        (dev / name).write_text("")
    monkeypatch.setattr(buildsteps, "NVIDIA_PROC_GPUS", proc)
    monkeypatch.setattr(buildsteps, "DEVICE_DIR", dev)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert buildsteps.gpu_likely() is expected


def test_a_census_that_fails_stops_the_worker_and_the_compiles_started_ahead(tiers, monkeypatch):
    from tunedb.build import compile_pool, speculative
    from tunedb.build import steps as buildsteps
    from tunedb.errors import CensusError

    order, spy = [], PrestartSpy()
    monkeypatch.setattr(buildsteps, "gpu_likely", lambda: True)
    monkeypatch.setattr(buildsteps, "start_worker", lambda opts, gpu: spy)
    monkeypatch.setattr(pipeline, "has_gpu", lambda: True)
    monkeypatch.setattr(speculative, "start", lambda workload, opts, kw, worker=None: order.append("ahead"))
    monkeypatch.setattr(compile_pool, "release", lambda family: order.append("release"))

    def fails(workload, **kw):
        raise CensusError("no such model")

    monkeypatch.setattr(pipeline, "take_census", fails)
    assert main(["tune", "whisper-base"]) != 0
    assert order == ["ahead", "release"] and spy.closed == 1


FP32_WORKLOAD = """
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(13, 7)
        self.b = torch.nn.Linear(7, 3, bias=False)

    def forward(self, x):
        return self.b(torch.nn.functional.gelu(self.a(x)))

def make(device):
    with torch.device(device):
        model = Net()
    return model, lambda batch, length: (torch.zeros(batch, length, 13, device=device),)
"""
FP32 = Signature.make("gemm", "gemm", "fp32", N=7, K=13)


@pytest.mark.parametrize("fused", [True, False])
def test_tune_of_an_fp32_model_says_torch_serves_it_and_plans_no_triton_config(tiers, tmp_path, monkeypatch,
                                                                               capsys, fused):
    """The GEMM family serves fp16/bf16 only; optimize() leaves an fp32 Linear to F.linear, so the
    plan must say so (unserved), neither crash in the fused census nor show a Triton default."""
    monkeypatch.setattr(pipeline, "has_gpu", lambda: False)
    monkeypatch.setenv("COLUMNS", "200")
    (tmp_path / "fp32_user_workload.py").write_text(FP32_WORKLOAD)
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = ["tune", "fp32_user_workload:make", "--max-batch-size", "2"] + ([] if fused else ["--no-fused"])
    assert main(argv) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if "dt=fp32" in line and "│" in line]
    assert rows and all(" unserved " in line and " default " not in line for line in rows)
    assert "A GPU would measure nothing here either" in out
    assert "of op(s) gemm dt=fp32 that no tunedb kernel family tunes" in " ".join(out.split())


def test_a_build_skips_signatures_of_a_dtype_the_family_does_not_serve(tiers):
    shapes = ShapeSet((Point(QKV, 16, 0.5, 10), Point(FP32, 16, 0.5, 10)))
    opts = pipeline.BuildOptions(out=str(tiers / "sim"), simulate=True, top_k=4)
    res = pipeline.tune("toy", opts, shapes=shapes)
    assert set(database.load(tiers / "sim" / "sm90" / "gemm.json").entries) == {QKV}
    assert FP32.format() in res.build.skipped


def test_the_cost_model_line_accounts_for_every_model_point(tiers, monkeypatch, capsys):
    """Served + declined + predicted-fallback must add up to the model-tier points the table
    shows (it said '0 of 4 served ...; 0 declined' and nothing about the other 4)."""
    import re

    monkeypatch.setattr(pipeline, "has_gpu", lambda: False)
    monkeypatch.setenv("COLUMNS", "400")  # the line unwrapped
    (tiers / "empty-system").mkdir()
    with database.system_root_override(tiers / "empty-system"):
        assert main(["tune", "whisper-base"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("cost model:"))
    total, served = map(int, re.search(r"(\d+) of (\d+) unmeasured", line).groups()[::-1])
    declined = int(re.search(r"; (\d+) declined", line).group(1))
    rest = re.search(r"; (\d+) predicted the fallback fastest", line)
    assert served + declined + (int(rest.group(1)) if rest else 0) == total > 0


BERT_WORKLOAD = """
import torch

POSITIONS = 512


class Block(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)
        self.out = torch.nn.Linear(hidden, hidden)
        self.up = torch.nn.Linear(hidden, 4 * hidden)
        self.down = torch.nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        x = x + self.out(torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v)
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class Bert(torch.nn.Module):
    def __init__(self, vocab=100, hidden=64):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, hidden)
        self.pos = torch.nn.Embedding(POSITIONS, hidden)
        self.blocks = torch.nn.Sequential(Block(hidden), Block(hidden))

    def forward(self, ids):
        if ids.shape[1] > POSITIONS:  # what a real position table does past its end, said plainly
            raise IndexError(f"{ids.shape[1]} tokens > {POSITIONS} positions")
        return self.blocks(self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device)))


def make(device):
    with torch.device(device):
        model = Bert().to(torch.bfloat16).eval()
    return model, lambda batch, length: (torch.zeros(batch, length, dtype=torch.long, device=device),)
"""


def test_tune_of_a_text_model_takes_the_census_length_flags(tiers, tmp_path, monkeypatch, capsys):
    """A BERT-style encoder with 512 positions under `tune`: --unit tokens --max-length 512 (as
    `tunedb census` spells them) probe it in tokens within its positions, and the plan prints
    (without them it was probed at audio-frame lengths past 3000 and failed)."""
    monkeypatch.setattr(pipeline, "has_gpu", lambda: False)
    monkeypatch.setenv("COLUMNS", "200")
    (tmp_path / "bert_workload.py").write_text(BERT_WORKLOAD)
    monkeypatch.syspath_prepend(str(tmp_path))
    manifest = tmp_path / "prompts.jsonl"
    manifest.write_text("".join(f'{{"tokens": {n}}}\n' for n in (12, 64, 100, 300, 512, 511, 200, 40)))
    argv = ["tune", "bert_workload:make", "--unit", "tokens", "--max-length", "512", "--manifest", str(manifest),
            "--all-points"]  # one row per point (a plan this long is grouped by signature by default)
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "census of bert_workload:make (offline)" in out and "what tunedb would serve on sm90" in out
    import re

    ms = [int(m) for m in re.findall(r"│ gemm\|op=gemm\S* +│ +(\d+) │", out)]  # the GEMM rows' M
    assert ms and max(ms) == 8 * 512  # the largest captured key: batch 8 at the 512-token limit
    assert "No GPU: nothing was measured." in out
    # what to run on a GPU is the same census: these flags, not the audio defaults
    assert f"`tunedb tune bert_workload:make --manifest {manifest} --unit tokens --max-length 512`" in out


def test_tune_and_census_length_flags_mean_the_same():
    """Same defaults, choices, types and help: a census command line's length flags work under tune."""
    from tunedb.cli import build_parser

    def actions(cmd):
        sub = next(a for a in build_parser(cmd)._actions if a.dest == "command").choices[cmd]
        return {a.option_strings[0]: (a.default, a.choices, a.type, a.help) for a in sub._actions
                if a.option_strings and a.option_strings[0] in ("--unit", "--max-length", "--length-step")}

    assert actions("tune") == actions("census") and len(actions("tune")) == 3


LSTM_WORKLOAD = """
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = torch.nn.LSTM(13, 7, batch_first=True)

    def forward(self, x):
        return self.rnn(x)[0]

def make(device):
    with torch.device(device):
        model = Net()
    return model, lambda batch, length: (torch.zeros(batch, length, 13, device=device),)
"""


def test_tune_of_a_recurrent_only_model_says_where_its_layers_are_tuned(tiers, tmp_path, monkeypatch, capsys):
    """An LSTM-only model makes no call tune's census records: the error says which layers and
    where they are tuned (it said only 'ran no call a family records')."""
    monkeypatch.setattr(pipeline, "has_gpu", lambda: False)
    (tmp_path / "lstm_user_workload.py").write_text(LSTM_WORKLOAD)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["tune", "lstm_user_workload:make", "--max-batch-size", "2"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "LSTM layer(s) are not in tune's census" in err and "families='all'" in err


PLAIN_CALLABLE_WORKLOAD = """
import torch


def make(device):
    w = torch.randn(8, 8, device=device)  # a plain tensor: the product is no call a family records
    return (lambda x: x @ w), (lambda batch, length: (torch.randn(batch, length, 8, device=device),))
"""


def test_a_plain_callable_model_that_records_nothing_gets_the_one_line_error(tiers, tmp_path, monkeypatch, capsys):
    """A workload's model may be any callable (the plain census takes one; --fused needs a Module):
    one whose probe records nothing gets the census's one-line error (it was an AttributeError on
    `.modules()` from the LSTM hint)."""
    monkeypatch.setattr(pipeline, "has_gpu", lambda: False)
    (tmp_path / "callable_user_workload.py").write_text(PLAIN_CALLABLE_WORKLOAD)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "census.json"
    assert main(["census", "callable_user_workload:make", "--max-batch-size", "1", "--out", str(out)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "ran no call a family records" in err and "Traceback" not in err and not out.exists()


def test_a_build_names_the_census_signatures_of_other_families_it_skips():
    from tunedb import families as registry
    from tunedb.build.run import signatures_by_census

    conv = Signature.parse("conv|op=conv1d|dt=bf16|C=256|K=31|G=256|O=256|S=1|P=15|D=1|act=none|bias=1")
    shapes = ShapeSet((Point(QKV, 16, 0.5, 10), Point(conv, 64, 0.5, 10)))
    points, _, skipped = signatures_by_census([("c", shapes)], registry.get("gemm"))
    assert set(points) == {QKV} and skipped == [conv]
