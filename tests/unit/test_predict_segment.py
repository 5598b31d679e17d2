"""predict for segmentation: the pixels val sees, a class map at each image's original size (the
probabilities resized bilinearly, then the argmax), its JSON line and summary, the colour overlay and
the class map saved as a PNG of class ids."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from libreyolo import LibreYOLO
from libreyolo.config import build_config
from libreyolo.data import shapes_seg
from libreyolo.data.segment import SegValDataset, load_segment_data
from libreyolo.model import resolve_model
from libreyolo.predict.core import Predictor
from libreyolo.predict.draw import annotate
from libreyolo.predict.post import PostOptions
from libreyolo.predict.sources import open_source

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("seg")
    shapes_seg.generate_shapes_seg(root, train=1, val=2, size=48)
    return load_segment_data(root)


def test_predict_sees_the_pixels_val_sees_and_maps_back_to_the_original_size(dataset):
    torch.manual_seed(0)
    predictor = Predictor(resolve_model("segformer-b0"), imgsz=32, device="cpu")
    predictor.model = predictor.model.__class__("b0", 11).eval()
    predictor.names = list(shapes_seg.SEG_NAMES)
    val = SegValDataset(dataset, build_config({"imgsz": 32}))
    images = torch.stack([val[i][0] for i in range(2)])
    with torch.inference_mode():
        probs = predictor.model.predict(images.float() / 255)
    results = [r for _, r in predictor.run(list(open_source([str(p) for p, _ in dataset.val])), PostOptions())]
    for r, p in zip(results, probs):
        assert r.task == "segment" and r.orig_shape == (48, 48) and r.mask.dtype == torch.uint8
        want = F.interpolate(p[None], size=(48, 48), mode="bilinear", align_corners=False)[0].argmax(0)
        assert torch.equal(r.mask.long(), want)
        line = r.to_dict()
        assert sum(c["pixels"] for c in line["classes"]) == 48 * 48
        assert [c["pixels"] for c in line["classes"]] == sorted((c["pixels"] for c in line["classes"]), reverse=True)
        assert r.summary().startswith(line["classes"][0]["name"] + " ")


def test_the_api_saves_an_overlay_and_the_class_map(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    image = np.random.default_rng(0).integers(0, 256, (37, 53, 3), dtype=np.uint8)
    [result] = LibreYOLO("segformer-b0").predict(image, imgsz=32, device="cpu", save=True)
    assert result.mask.shape == (37, 53) and int(result.mask.max()) < 150
    saved = Image.open(result.extra["mask_saved"])
    assert saved.mode == "P" and saved.size == (53, 37)
    assert np.array_equal(np.asarray(saved), result.mask.numpy())  # the PNG's pixel values are the ids
    assert result.extra["saved"].endswith("image0.jpg") and result.extra["mask_saved"].endswith("image0_mask.png")
    overlay = annotate(torch.from_numpy(image).permute(2, 0, 1), result)
    assert overlay.shape == (3, 37, 53) and not torch.equal(overlay, torch.from_numpy(image).permute(2, 0, 1))


def test_the_class_map_is_resized_a_few_classes_at_a_time_with_the_one_shot_argmax(monkeypatch):
    """A big photo's map is resized in class groups (bounded memory); ties and all go where one
    resize of every class and its argmax put them."""
    from libreyolo.predict import post

    probs = torch.rand(7, 12, 10)
    probs[3, :4] = probs[5, :4] = 2.0  # ties between groups: the first class wins, as argmax's
    whole = F.interpolate(probs[None], size=(37, 29), mode="bilinear", align_corners=False)[0].argmax(0)
    for budget in (1, 37 * 29 * 2, 37 * 29 * 3, 1 << 26):  # one class a group, 2, 3, all
        monkeypatch.setattr(post, "UPSAMPLE_ELEMENTS", budget)
        assert torch.equal(post.upsampled_argmax(probs, 37, 29), whole), budget
