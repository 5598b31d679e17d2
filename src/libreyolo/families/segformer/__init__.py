"""SegFormer (Xie et al., NeurIPS 2021): a Mix Transformer encoder and an all-MLP decoder."""
