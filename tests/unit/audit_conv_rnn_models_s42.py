"""Models for test_audit_s42_conv_rnn.py, in a file of their own (optimize()'s rules read each
model class's whole source file, and a test's own `model.body[0]` would count as a read)."""
import torch
from torch import nn


class ConvStemRnn(nn.Module):
    """A speech front end: conv2d + ReLU subsampling, a depthwise conv1d + norm + SiLU, then an
    LSTM and a GRU over time (every module the conv and rnn families swap)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 4, 3, stride=2), nn.ReLU(), nn.Conv2d(4, 4, 3, stride=2), nn.SiLU())
        self.dw = nn.Sequential(nn.Conv1d(8, 8, 5, padding=2, groups=8), nn.BatchNorm1d(8), nn.SiLU())
        self.lstm = nn.LSTM(8, 6, num_layers=2, batch_first=True, bidirectional=True, dropout=0.25)
        self.gru = nn.GRU(12, 5, batch_first=True)

    def forward(self, x):  # x [B, 1, T, F]
        y = self.stem(x)  # [B, 4, T', 2] for F = 11
        y = self.dw(y.transpose(2, 3).flatten(1, 2))  # [B, 8, T']
        out, (h, c) = self.lstm(y.transpose(1, 2))
        z, hz = self.gru(out)
        return z, h, c, hz
