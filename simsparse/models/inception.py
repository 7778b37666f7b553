"""Inception-v4 (Szegedy et al. 2017, fig. 3-9) for ImageNet.

Follows the Cadene ``pretrainedmodels/models/inceptionv4.py`` layout that
GaussianK-SGD copies as ``models/inceptionv4.py``: every convolution is
bias-free and followed by BatchNorm (eps 1e-3) and ReLU; 1000 classes.
Input: 3x299x299. 42,679,816 parameters in 449 tensors. The code is our own.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class Conv(nn.Module):
    """Conv (no bias) + BatchNorm(eps=1e-3) + ReLU."""

    def __init__(self, cin, cout, k, stride=1, padding=0):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, stride=stride, padding=padding, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=0.001)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


def _seq(*specs):
    return nn.Sequential(*(Conv(*s[:3], **(s[3] if len(s) > 3 else {})) for s in specs))


_P17 = {"padding": (0, 3)}   # 1x7
_P71 = {"padding": (3, 0)}   # 7x1
_P13 = {"padding": (0, 1)}   # 1x3
_P31 = {"padding": (1, 0)}   # 3x1
_P1 = {"padding": 1}


class Mixed3a(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = Conv(64, 96, 3, stride=2)

    def forward(self, x):
        return torch.cat((F.max_pool2d(x, 3, 2), self.conv(x)), 1)


class Mixed4a(nn.Module):
    def __init__(self):
        super().__init__()
        self.branch0 = _seq((160, 64, 1), (64, 96, 3))
        self.branch1 = _seq((160, 64, 1), (64, 64, (1, 7), _P17), (64, 64, (7, 1), _P71), (64, 96, 3))

    def forward(self, x):
        return torch.cat((self.branch0(x), self.branch1(x)), 1)


class Mixed5a(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = Conv(192, 192, 3, stride=2)

    def forward(self, x):
        return torch.cat((self.conv(x), F.max_pool2d(x, 3, 2)), 1)


class InceptionA(nn.Module):
    def __init__(self):
        super().__init__()
        self.branch0 = Conv(384, 96, 1)
        self.branch1 = _seq((384, 64, 1), (64, 96, 3, _P1))
        self.branch2 = _seq((384, 64, 1), (64, 96, 3, _P1), (96, 96, 3, _P1))
        self.branch3 = Conv(384, 96, 1)

    def forward(self, x):
        x0, x1, x2 = self.branch0(x), self.branch1(x), self.branch2(x)
        return torch.cat((x0, x1, x2, self.branch3(F.avg_pool2d(x, 3, 1, 1, count_include_pad=False))), 1)


class ReductionA(nn.Module):
    def __init__(self):
        super().__init__()
        self.branch0 = Conv(384, 384, 3, stride=2)
        self.branch1 = _seq((384, 192, 1), (192, 224, 3, _P1), (224, 256, 3, {"stride": 2}))

    def forward(self, x):
        return torch.cat((self.branch0(x), self.branch1(x), F.max_pool2d(x, 3, 2)), 1)


class InceptionB(nn.Module):
    def __init__(self):
        super().__init__()
        self.branch0 = Conv(1024, 384, 1)
        self.branch1 = _seq((1024, 192, 1), (192, 224, (1, 7), _P17), (224, 256, (7, 1), _P71))
        self.branch2 = _seq((1024, 192, 1), (192, 192, (7, 1), _P71), (192, 224, (1, 7), _P17),
                            (224, 224, (7, 1), _P71), (224, 256, (1, 7), _P17))
        self.branch3 = Conv(1024, 128, 1)

    def forward(self, x):
        x0, x1, x2 = self.branch0(x), self.branch1(x), self.branch2(x)
        return torch.cat((x0, x1, x2, self.branch3(F.avg_pool2d(x, 3, 1, 1, count_include_pad=False))), 1)


class ReductionB(nn.Module):
    def __init__(self):
        super().__init__()
        self.branch0 = _seq((1024, 192, 1), (192, 192, 3, {"stride": 2}))
        self.branch1 = _seq((1024, 256, 1), (256, 256, (1, 7), _P17), (256, 320, (7, 1), _P71),
                            (320, 320, 3, {"stride": 2}))

    def forward(self, x):
        return torch.cat((self.branch0(x), self.branch1(x), F.max_pool2d(x, 3, 2)), 1)


class InceptionC(nn.Module):
    def __init__(self):
        super().__init__()
        self.branch0 = Conv(1536, 256, 1)
        self.branch1_0 = Conv(1536, 384, 1)
        self.branch1_1a = Conv(384, 256, (1, 3), **_P13)
        self.branch1_1b = Conv(384, 256, (3, 1), **_P31)
        self.branch2_0 = Conv(1536, 384, 1)
        self.branch2_1 = Conv(384, 448, (3, 1), **_P31)
        self.branch2_2 = Conv(448, 512, (1, 3), **_P13)
        self.branch2_3a = Conv(512, 256, (1, 3), **_P13)
        self.branch2_3b = Conv(512, 256, (3, 1), **_P31)
        self.branch3 = Conv(1536, 256, 1)

    def forward(self, x):
        x0 = self.branch0(x)
        x1 = self.branch1_0(x)
        x1 = torch.cat((self.branch1_1a(x1), self.branch1_1b(x1)), 1)
        x2 = self.branch2_2(self.branch2_1(self.branch2_0(x)))
        x2 = torch.cat((self.branch2_3a(x2), self.branch2_3b(x2)), 1)
        x3 = self.branch3(F.avg_pool2d(x, 3, 1, 1, count_include_pad=False))
        return torch.cat((x0, x1, x2, x3), 1)


class InceptionV4(nn.Module):
    """Inception-v4: stem, 4x Inception-A, Reduction-A, 7x Inception-B, Reduction-B, 3x Inception-C, Linear 1536 -> 1000.

    Layout of Cadene ``pretrainedmodels`` ``inceptionv4.py`` (as copied in GaussianK-SGD
    ``models/inceptionv4.py``). Input: 3x299x299.
    """

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        self.features = nn.Sequential(
            Conv(3, 32, 3, stride=2), Conv(32, 32, 3), Conv(32, 64, 3, padding=1),
            Mixed3a(), Mixed4a(), Mixed5a(),
            *(InceptionA() for _ in range(4)), ReductionA(),
            *(InceptionB() for _ in range(7)), ReductionB(),
            *(InceptionC() for _ in range(3)))
        self.last_linear = nn.Linear(1536, num_classes)

    def forward(self, x):
        x = self.features(x)
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.last_linear(x)


def build(name: str) -> nn.Module:
    assert name == "inception_v4_imagenet", name
    return InceptionV4()


def example_batch(name: str, batch_size: int, generator=None, device="cpu"):
    from .cnn import image_batch
    return image_batch(batch_size, 299, 1000, generator, device)


def loss(name: str, model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)
