"""optimize() on the fourteen zoo models no table names (bench/unseen_zoo_models.py: a ViT, torch's
TransformerEncoder, conv nets, GRU/LSTM speech, GPT-2's Conv1D, a T5 encoder-decoder, a UNet, a
Mamba-like scan, Mixer/ConvNeXt on strided views, shared and fp32 heads, ...), on the CPU with the
shipped tables: it must not raise, must compute what the model computes (CPU tensors take the torch
arms), keep the state_dict keys and let gradients through (bench/unseen_zoo_cpu.py's checks, fp32,
the three ways optimize() is called). About 20 s."""
import pytest

pytest.importorskip("torch")

from bench_modules import bench_module  # noqa: E402


def test_every_zoo_model_through_optimize_on_the_cpu(capsys):
    zoo_cpu = bench_module("unseen_zoo_cpu")
    assert zoo_cpu.main(["--dtypes", "fp32"]) == 0, capsys.readouterr().out[-4000:]
