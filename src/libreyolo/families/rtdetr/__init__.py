"""RT-DETR (v1) and RT-DETRv2 families, ResNet-18-vd."""

from .net import SIZES, RTDETRModel, RTDETRv2Model, build, build_v2

__all__ = ["SIZES", "RTDETRModel", "RTDETRv2Model", "build", "build_v2"]
