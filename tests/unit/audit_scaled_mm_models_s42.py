"""Small models for tests/unit/test_audit_s42_scaled_mm.py (optimize() reads model source files)."""
import torch


class TwoLinear(torch.nn.Module):
    """Two biased Linears (widths multiples of 16 and of 128, so every torchao scheme takes them)."""

    def __init__(self, k: int = 256, h: int = 256, n: int = 128):
        super().__init__()
        self.up = torch.nn.Linear(k, h)
        self.down = torch.nn.Linear(h, n)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))
