"""Models for test_optimize_robust_s29.py, in a file of their own: optimize()'s fusion reads the
source file of each model class for attributes read off other modules, and a test file full of
`m.fc(...)` would refuse every fusion."""
from torch import nn


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.act = nn.Linear(32, 48), nn.ReLU()

    def forward(self, x):
        return self.act(self.fc(x))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp, self.gate = MLP(), nn.Linear(32, 48)

    def forward(self, x):
        return self.mlp(x) * self.mlp.act(self.gate(x))  # the MLP's activation called from outside
