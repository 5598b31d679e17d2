"""DEIMv2 (Huang et al., 2025): DEIM's training on HGNetv2 sizes with a LiteEncoder, RMSNorm and
SwiGLU in the decoder, and a late class x IoU matching. Builds on ../dfine and ../detr."""
