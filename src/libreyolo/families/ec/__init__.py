"""EdgeCrafter's ECDet (Liu et al., 2026): a distilled ViT (ECViT) with an adapter, D-FINE's encoder and
decoder in DEIM's form, trained with DEIM's loss. Builds on ../dfine and ../detr."""
