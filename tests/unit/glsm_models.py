"""Models for test_gemm_log_softmax.py, in a file of their own: optimize()'s head swap reads a
class's whole source file for reads of the head's attribute off other objects (the tests read
`model.ctc_head[1]`), as the gemm fusion rule does (fusion_source.outside_reads)."""
import torch


class CtcModel(torch.nn.Module):
    def __init__(self, d: int = 64, vocab: int = 300) -> None:
        super().__init__()
        self.enc = torch.nn.Linear(d, d)
        self.ctc_head = torch.nn.Sequential(torch.nn.Dropout(0.0), torch.nn.Linear(d, vocab),
                                            torch.nn.LogSoftmax(dim=-1))
        self.aux = torch.nn.Linear(d, 10)  # not followed by log_softmax: not a key

    def forward(self, x):
        h = torch.relu(self.enc(x))
        self.aux(h)
        return self.ctc_head(h)


class FunctionalHead(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(32, 500, bias=False)

    def forward(self, x):
        return torch.nn.functional.log_softmax(self.proj(x), dim=-1)
