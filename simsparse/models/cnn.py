"""Image classifiers: VGG, ResNet (CIFAR and ImageNet), AlexNet.

Layer shapes and registration order follow the public definitions named in each
class docstring; the code is our own. Every model maps an NCHW float image to
class logits and trains with cross-entropy.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

_VGG16 = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]


class VGGCifar(nn.Module):
    """VGG-16 for CIFAR-10 as in Ok-Topk ``VGG/models/vgg.py`` (kuangliu/pytorch-cifar ``models/vgg.py``).

    Each 3x3 convolution keeps its bias and is followed by BatchNorm and ReLU; five
    2x2 max-pools bring 32x32 down to 1x1, then one Linear 512 -> 10.
    Input: 3x32x32. 14,728,266 parameters in 54 tensors.
    """

    def __init__(self, cfg=_VGG16, num_classes: int = 10):
        super().__init__()
        layers: list[nn.Module] = []
        c = 3
        for v in cfg:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(c, v, 3, padding=1), nn.BatchNorm2d(v), nn.ReLU(inplace=True)]
                c = v
        layers.append(nn.AvgPool2d(1, 1))
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.features(x), 1))


class VGGImageNet(nn.Module):
    """VGG-16 (configuration D, no BatchNorm) for ImageNet as in torchvision ``models/vgg.py``.

    Input: 3x224x224. Classifier 25088 -> 4096 -> 4096 -> 1000 with ReLU and dropout 0.5.
    138,357,544 parameters in 32 tensors.
    """

    def __init__(self, cfg=_VGG16, num_classes: int = 1000):
        super().__init__()
        layers: list[nn.Module] = []
        c = 3
        for v in cfg:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(c, v, 3, padding=1), nn.ReLU(inplace=True)]
                c = v
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096), nn.ReLU(True), nn.Dropout(0.5),
            nn.Linear(4096, 4096), nn.ReLU(True), nn.Dropout(0.5),
            nn.Linear(4096, num_classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class AlexNet(nn.Module):
    """AlexNet (one-GPU variant) as in torchvision ``models/alexnet.py``, used by GaussianK/Ok-Topk ``dl_trainer.py``.

    Input: 3x224x224. 61,100,840 parameters in 16 tensors.
    """

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 11, stride=4, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
            nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
            nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2))
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            nn.Dropout(0.5), nn.Linear(256 * 6 * 6, 4096), nn.ReLU(inplace=True),
            nn.Dropout(0.5), nn.Linear(4096, 4096), nn.ReLU(inplace=True),
            nn.Linear(4096, num_classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class _ShortcutA(nn.Module):
    """Option-A shortcut: stride-2 subsampling plus zero channels (no parameters)."""

    def __init__(self, stride: int, extra: int):
        super().__init__()
        self.stride, self.extra = stride, extra

    def forward(self, x):
        x = x[:, :, ::self.stride, ::self.stride]
        return F.pad(x, (0, 0, 0, 0, 0, self.extra))


class _CifarBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv_a = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn_a = nn.BatchNorm2d(cout)
        self.conv_b = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn_b = nn.BatchNorm2d(cout)
        self.shortcut = _ShortcutA(stride, cout - cin) if (stride != 1 or cin != cout) else None

    def forward(self, x):
        y = F.relu(self.bn_a(self.conv_a(x)))
        y = self.bn_b(self.conv_b(y))
        r = x if self.shortcut is None else self.shortcut(x)
        return F.relu(r + y)


class CifarResNet(nn.Module):
    """ResNet-20/32/56/110 for CIFAR-10 (He et al. 2016 sec. 4.2) as in GaussianK-SGD ``models/resnet.py``
    (ResNet-32: the FFT-sparsification paper, Wang et al. HPDC'20, section 4).

    3x3 stem with 16 channels, three stages of (depth-2)/6 basic blocks with 16/32/64
    channels, option-A (parameter-free) shortcuts, 8x8 average pool, Linear 64 -> 10.
    Input: 3x32x32. ResNet-20 has 269,722 parameters in 59 tensors.
    """

    def __init__(self, depth: int, num_classes: int = 10):
        super().__init__()
        assert (depth - 2) % 6 == 0
        n = (depth - 2) // 6
        self.conv_1_3x3 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn_1 = nn.BatchNorm2d(16)
        stages, c = [], 16
        for i, w in enumerate((16, 32, 64)):
            blocks = []
            for j in range(n):
                blocks.append(_CifarBlock(c, w, 2 if (i > 0 and j == 0) else 1))
                c = w
            stages.append(nn.Sequential(*blocks))
        self.stage_1, self.stage_2, self.stage_3 = stages
        self.classifier = nn.Linear(64, num_classes)

    def forward(self, x):
        x = F.relu(self.bn_1(self.conv_1_3x3(x)))
        x = self.stage_3(self.stage_2(self.stage_1(x)))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.classifier(x)


class _BasicBlockB(nn.Module):
    """Basic block with a 1x1 conv + BN projection shortcut (kuangliu/pytorch-cifar ``models/resnet.py``)."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + self.shortcut(x))


class ResNet18Cifar(nn.Module):
    """ResNet-18 for CIFAR-10 as in kuangliu/pytorch-cifar ``models/resnet.py``.

    3x3 stem with 64 channels (no max-pool), four stages of two basic blocks (64/128/256/512),
    projection shortcuts, 4x4 average pool, Linear 512 -> 10.
    Input: 3x32x32. 11,173,962 parameters in 62 tensors.
    """

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        c, layers = 64, []
        for i, w in enumerate((64, 128, 256, 512)):
            layers.append(nn.Sequential(_BasicBlockB(c, w, 1 if i == 0 else 2), _BasicBlockB(w, w, 1)))
            c = w
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.linear = nn.Linear(512, num_classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.linear(F.avg_pool2d(x, 4).flatten(1))


class _Bottleneck(nn.Module):
    """ResNet v1.5 bottleneck (stride on the 3x3 conv) as in torchvision ``models/resnet.py``."""

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = 4 * width
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        r = x if self.downsample is None else self.downsample(x)
        return self.relu(y + r)


class ResNet50(nn.Module):
    """ResNet-50 (v1.5) for ImageNet as in torchvision ``models/resnet.py``.

    7x7/2 stem, 3x3/2 max-pool, bottleneck stages of 3/4/6/3 blocks (widths 64..512, x4
    expansion), global average pool, Linear 2048 -> 1000.
    Input: 3x224x224. 25,557,032 parameters in 161 tensors.
    """

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        c, layers = 64, []
        for i, (w, n) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3))):
            blocks = []
            for j in range(n):
                blocks.append(_Bottleneck(c, w, 2 if (i > 0 and j == 0) else 1))
                c = 4 * w
            layers.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


_BUILDERS = {
    "vgg16_cifar10": (lambda: VGGCifar(), 32, 10),
    "resnet20_cifar10": (lambda: CifarResNet(20), 32, 10),
    "resnet32_cifar10": (lambda: CifarResNet(32), 32, 10),
    "resnet56_cifar10": (lambda: CifarResNet(56), 32, 10),
    "resnet110_cifar10": (lambda: CifarResNet(110), 32, 10),
    "resnet18_cifar10": (lambda: ResNet18Cifar(), 32, 10),
    "resnet50_imagenet": (lambda: ResNet50(), 224, 1000),
    "alexnet_imagenet": (lambda: AlexNet(), 224, 1000),
    "vgg16_imagenet": (lambda: VGGImageNet(), 224, 1000),
}


def build(name: str) -> nn.Module:
    return _BUILDERS[name][0]()


def image_batch(batch_size: int, side: int, classes: int, generator=None, device="cpu"):
    """Synthetic normalised images (N, 3, side, side) and integer class labels."""
    x = torch.randn(batch_size, 3, side, side, generator=generator)
    y = torch.randint(0, classes, (batch_size,), generator=generator)
    return x.to(device), y.to(device)


def example_batch(name: str, batch_size: int, generator=None, device="cpu"):
    _, side, classes = _BUILDERS[name]
    return image_batch(batch_size, side, classes, generator, device)


def loss(name: str, model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)
