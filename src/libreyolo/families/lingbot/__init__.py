"""LingBot-Vision (Fu et al., 2026, arXiv 2607.05247): a ViT-S/16 with axial RoPE, register tokens and
LayerScale, with DINOv3's linear segmentation head."""
