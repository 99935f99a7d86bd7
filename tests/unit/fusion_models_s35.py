"""Models for test_fusion_rules_s35.py, in a file of their own (optimize()'s rules read each
model class's whole source file for attribute reads off other objects)."""
import torch
from torch import nn


class InModuleList(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Sequential(nn.Linear(8, 8), nn.ReLU())])

    def forward(self, x):
        pre = self.layers[0][0](x)
        return self.layers[0][1](pre), pre


class ConvFeatures(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU())

    def forward(self, x):
        out = []
        for layer in self.features:
            x = layer(x)
            out.append(x)
        return out


class OwnSequential(nn.Sequential):
    def forward(self, x):
        y = self[0](x)
        return self[1](y) - y


class ConvInOwnSequential(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = OwnSequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU())

    def forward(self, x):
        return self.body(x)


class LogitsWanted(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Sequential(nn.Linear(8, 10), nn.LogSoftmax(-1))

    def forward(self, x):
        return self.head[0](x)


class SharedProjection(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 10)
        self.ctc = nn.Sequential(self.proj, nn.LogSoftmax(-1))

    def forward(self, x):
        return self.ctc(x), self.proj(x)
