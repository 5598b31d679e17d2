"""RTMDet (CSPNeXt + shared-conv/separate-BN head): network, dynamic soft-label assigner, loss, spec."""

from .loss import RTMDetLoss, criterion
from .net import ARCHS, RTMDetModel, build

__all__ = ["ARCHS", "RTMDetLoss", "RTMDetModel", "build", "criterion"]
