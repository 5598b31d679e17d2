"""RT-DETRv4: DEIM's network and recipe (its s size); the DINOv3 teacher distillation is left out."""
