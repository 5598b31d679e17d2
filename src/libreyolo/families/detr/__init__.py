"""The shared DETR core: output type, box helpers, Hungarian matching, contrastive denoising,
query selection, deformable-attention layers and the set-prediction criterion that RT-DETR v1/v2,
D-FINE, DEIM, RT-DETRv4, DEIMv2, ECDet and RF-DETR build on (docs/architecture.md, "DETR families"; the family contract
in families/base.py)."""

# Host synchronisations of one DETR training step on CUDA, the only ones it makes (the GPU test
# counts them with torch's sync debug mode): the denoising group count reads the batch's largest
# box count (denoise.max_boxes), and torch-linear-assignment checks its input twice (a NaN/-inf
# read and an infeasibility read) before and after its one batched solve (matcher.py). This is
# the default (Triton, compute capability >= 8); with SciPy the solve's copies to the host and
# back are the syncs instead of those two (benchmarks/assign_bench.py counted 2 for them).
STEP_HOST_SYNCS = 3
