"""The shared DETR core: output type, box helpers, Hungarian matching, contrastive denoising,
deformable-attention layers and the set-prediction criterion that RT-DETR v1/v2, D-FINE and DEIM
build on (docs: /work/notes/detr_contract.md, the family contract in families/base.py)."""
