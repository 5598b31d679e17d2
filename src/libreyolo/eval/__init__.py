"""Validation: post-processing and COCO box mAP through faster-coco-eval."""

from libreyolo.eval.coco import coco_map, evaluate
from libreyolo.eval.postprocess import postprocess, unletterbox

__all__ = ["coco_map", "evaluate", "postprocess", "unletterbox"]
