"""DEIM (Huang et al., CVPR 2025): D-FINE's network (SiLU decoder) trained with MAL and DEIM's
recipe (dense one-to-one matching through mosaic/mixup, FlatCosine). The code is in ../dfine."""
