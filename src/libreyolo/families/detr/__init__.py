"""The shared DETR core: output type, box helpers, Hungarian matching, contrastive denoising,
query selection, deformable-attention layers and the set-prediction criterion that RT-DETR v1/v2,
D-FINE, DEIM, RT-DETRv4, DEIMv2, ECDet and RF-DETR build on (docs/architecture.md, "DETR families"; the family contract
in families/base.py)."""

# Host synchronisations of one DETR training step on CUDA, the only ones it makes (the GPU test
# counts them with torch's sync debug mode, `DETRModel.host_syncs`): the denoising's read of the
# batch's largest box count (denoise.py; none under the model's `static_shapes`), and the
# matcher's, none with the Triton solve (matcher.py; 2 with SciPy's copies to the host and back).
DENOISING_HOST_SYNCS = 1
