"""`libreyolo` with YOLOv9's box branch ungrouped: the time-to-accuracy arm `ours-graph-g1`.

Our YOLOv9 head is the paper's DDetect: its box branch's middle 3x3 conv and final 1x1 have 4
groups (one per box side), which reproduces the published YOLOv9-t size (2.0 M parameters). The
peer trainer's YOLOv9-t uses groups=1 there (92,160 more parameters). This runs the real command
line with that one difference, to measure what it does to accuracy per epoch, without a knob in
the library:

    python benchmarks/ungrouped_box.py train model=yolo9-t data=... [key=value ...]
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from libreyolo.families.common import ConvBNAct
from libreyolo.families.yolo9 import net

_grouped_init = net.DetectHead.__init__


def _ungrouped_init(self, channels, num_classes, reg_max=net.REG_MAX, strides=net.STRIDES):
    _grouped_init(self, channels, num_classes, reg_max, strides)
    cb = self.box[0][0].conv.out_channels
    self.box = nn.ModuleList(nn.Sequential(ConvBNAct(c, cb, 3), ConvBNAct(cb, cb, 3), nn.Conv2d(cb, 4 * reg_max, 1))
                             for c in channels)
    with torch.no_grad():
        for box in self.box:
            box[-1].bias.fill_(1.0)


net.DetectHead.__init__ = _ungrouped_init

if __name__ == "__main__":
    from libreyolo.cli.app import main

    main(sys.argv[1:])
