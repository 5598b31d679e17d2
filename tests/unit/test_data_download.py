"""Dataset download against a local http.server on 127.0.0.1: success, checksum mismatch,
path traversal, connection refused, and the packaged coco128 through a mirror base URL."""

import functools
import hashlib
import http.server
import io
import socket
import threading
import zipfile
from pathlib import Path

import pytest
import torch
from torchvision.io import encode_jpeg

from libreyolo.data import load_data_config
from libreyolo.errors import DataError

pytestmark = pytest.mark.filterwarnings("ignore:The image decoding:DeprecationWarning")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def server(tmp_path):
    """Serve tmp_path/www; yields (folder, base_url)."""
    www = tmp_path / "www"
    www.mkdir()
    handler = functools.partial(_Quiet, directory=str(www))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield www, f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _dataset_zip(top: str, split: str = "train") -> bytes:
    jpg = encode_jpeg(torch.full((3, 16, 16), 80, dtype=torch.uint8)).numpy().tobytes()
    return _zip({f"{top}/images/{split}/a.jpg": jpg, f"{top}/images/{split}/b.jpg": jpg,
                 f"{top}/labels/{split}/a.txt": b"0 0.5 0.5 0.2 0.2\n"})


def _yaml(tmp_path: Path, sha: str | None) -> Path:
    y = tmp_path / "mini.yaml"
    y.write_text("path: data/mini\ntrain: images/train\nval: images/train\nnames: [thing]\n"
                 "download: mini.zip\n" + (f"sha256: '{sha}'\n" if sha else ""))
    return y


def _leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if ".tmp-" in p.name] if folder.exists() else []


def test_download_verify_extract(server, tmp_path, monkeypatch):
    www, base = server
    data = _dataset_zip("mini")
    (www / "mini.zip").write_bytes(data)
    monkeypatch.setenv("LIBREYOLO_DATASETS_URL", base)
    cfg = load_data_config(_yaml(tmp_path, hashlib.sha256(data).hexdigest()))
    assert cfg.root == (tmp_path / "data" / "mini").resolve()
    assert [p.name for p in cfg.train] == ["a.jpg", "b.jpg"]
    assert (cfg.root / "labels" / "train" / "a.txt").is_file()
    assert _leftovers(tmp_path / "data") == []
    (www / "mini.zip").unlink()  # present now: a second load must not download again
    assert len(load_data_config(_yaml(tmp_path, None)).train) == 2


def test_checksum_mismatch(server, tmp_path, monkeypatch):
    www, base = server
    (www / "mini.zip").write_bytes(_dataset_zip("mini"))
    monkeypatch.setenv("LIBREYOLO_DATASETS_URL", base)
    with pytest.raises(DataError) as e:
        load_data_config(_yaml(tmp_path, "0" * 64))
    msg = str(e.value)
    assert "checksum mismatch" in msg and "\n" not in msg
    assert str((tmp_path / "data" / "mini").resolve()) in msg
    assert not (tmp_path / "data" / "mini").exists() and _leftovers(tmp_path / "data") == []


@pytest.mark.parametrize("member", ["../evil.txt", "mini/../../evil.txt", "/abs/evil.txt"])
def test_unsafe_members_are_refused(server, tmp_path, monkeypatch, member):
    www, base = server
    data = _zip({"mini/images/train/a.jpg": b"x", member: b"owned"})
    (www / "mini.zip").write_bytes(data)
    monkeypatch.setenv("LIBREYOLO_DATASETS_URL", base)
    with pytest.raises(DataError) as e:
        load_data_config(_yaml(tmp_path, hashlib.sha256(data).hexdigest()))
    assert "unsafe path" in str(e.value) and "\n" not in str(e.value)
    assert not list(tmp_path.rglob("evil.txt"))
    assert not (tmp_path / "data" / "mini").exists() and _leftovers(tmp_path / "data") == []


def test_sha256_must_be_a_quoted_hex_string(tmp_path):
    y = tmp_path / "d.yaml"
    y.write_text("train: a\nval: a\nnames: [x]\ndownload: d.zip\nsha256: 1234\n")
    with pytest.raises(DataError, match="sha256 must be 64 hex digits"):
        load_data_config(y)


def test_connection_refused_says_where_to_put_the_data(tmp_path, monkeypatch):
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("LIBREYOLO_DATASETS_URL", f"http://127.0.0.1:{port}")
    with pytest.raises(DataError) as e:
        load_data_config(_yaml(tmp_path, None))
    msg = str(e.value)
    assert "could not download" in msg and "\n" not in msg
    assert f"place the dataset at {(tmp_path / 'data' / 'mini').resolve()}" in msg
    assert "data=shapes" in msg


def test_packaged_coco128_through_a_mirror(server, tmp_path, monkeypatch):
    www, base = server
    (www / "coco128.zip").write_bytes(_dataset_zip("coco128", "train2017"))
    monkeypatch.setenv("LIBREYOLO_DATASETS_URL", base.rstrip("/"))
    monkeypatch.setenv("LIBREYOLO_CACHE", str(tmp_path / "cache"))
    cfg = load_data_config("coco128")
    assert cfg.root == (tmp_path / "cache" / "datasets" / "coco128").resolve()
    assert cfg.nc == 80 and cfg.names[0] == "person" and cfg.names[79] == "toothbrush"
    assert len(cfg.train) == 2 and cfg.val == cfg.train
