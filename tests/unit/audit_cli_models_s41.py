"""User workloads (module:callable) for test_audit_cli_s41.py: what a new user points `tunedb tune`
and `tunedb census` at, in a module of their own as a user's would be."""
import torch
from torch import nn


class EmptyRows(nn.Module):
    """A bf16 Linear called on an input with no rows (an empty slice: no token routed to it)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(64, 48)
        self.side = nn.Linear(64, 40)

    def forward(self, x):
        return self.proj(x), self.side(x[:, :0])


def empty_rows(device):
    model = EmptyRows().to(device=device, dtype=torch.bfloat16).eval()
    return model, lambda b, n: (torch.randn(b, n, 64, device=device, dtype=torch.bfloat16),)


class AutocastBody(nn.Module):
    """An fp32 body run under torch.autocast in forward (as a mixed-precision model does), then a
    bf16 head outside it."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(64, 96)
        self.head = nn.Linear(96, 32).to(torch.bfloat16)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = self.body(x)
        return self.head(h.to(torch.bfloat16))


def autocast_body(device):
    return AutocastBody().to(device).eval(), lambda b, n: (torch.randn(b, n, 64, device=device),)
