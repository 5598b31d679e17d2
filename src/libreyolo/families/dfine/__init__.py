"""D-FINE (and the DEIM / RT-DETRv4 recipes on the same network): HGNetv2, hybrid encoder with
GELAN blocks, fine-grained distribution refinement decoder, their losses and specs."""
