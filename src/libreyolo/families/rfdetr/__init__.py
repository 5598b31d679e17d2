"""RF-DETR (Roboflow): a windowed DINOv2 ViT-S with LW-DETR's projector and decoder, trained with
Group DETR and IA-BCE. Builds on ../detr."""
