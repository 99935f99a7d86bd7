"""Blocks whose code reaches a fused Linear other than by `self.<name>` (test_fusion_escapes_s52.py):
their own file, since fusion rule 2 reads the whole source file of a block's class."""
from __future__ import annotations

import functools
import operator

from torch import nn


class _Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.act = nn.GELU()


class TapByPath(_Pair):
    """Returns a layer's raw output too, found by a dotted path (functools.reduce over getattr)."""

    def forward(self, x):
        out = self.act(self.proj(x))
        return out, functools.reduce(getattr, "proj".split("."), self)(x)


class TapByGetter(_Pair):
    def forward(self, x):
        return self.act(self.proj(x)), operator.attrgetter("proj")(self)(x)


class TapByVars(_Pair):
    def forward(self, x):
        return self.act(self.proj(x)), vars(self)["_modules"]["proj"](x)


class TapByDict(_Pair):
    def forward(self, x):
        return self.act(self.proj(x)), self.__dict__["_modules"]["proj"](x)


class TapByHelper(_Pair):
    @staticmethod
    def _run(layer, x):
        return layer(x)

    def forward(self, x):
        return self.act(self.proj(x)), self._run(dict(self.named_children())["proj"], x)


class PlainPair(_Pair):
    """The control: its code names each child once, as `self.<name>` (fused)."""

    def forward(self, x):
        return self.act(self.proj(x)), x


class TapByGetattrModules(_Pair):
    def forward(self, x):
        return self.act(self.proj(x)), getattr(self, "_modules")["proj"](x)
