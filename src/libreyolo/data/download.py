"""Fetch a dataset zip on first use: download, verify sha256, extract safely, rename into place.

`download:` in a dataset yaml is a full URL or a file name joined to the base URL
(`$LIBREYOLO_DATASETS_URL`, else DEFAULT_BASE_URL). Nothing half-done is left at the target: the
zip is downloaded to a temp file, extracted into a temp folder next to the target, and the
dataset folder is renamed into place only when everything succeeded. Members with absolute
paths or `..` components are refused before anything is extracted.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import urllib.error
import urllib.request
import uuid
import zipfile
from pathlib import Path, PurePosixPath

from ..atomic import atomic_path
from ..errors import DataError
from .cache import check_dataset_target

log = logging.getLogger("libreyolo")

DEFAULT_BASE_URL = "https://github.com/ultralytics/assets/releases/download/v0.0.0/"
TIMEOUT_S = 30


def dataset_url(download: str) -> str:
    if "://" in download:
        return download
    base = os.environ.get("LIBREYOLO_DATASETS_URL") or DEFAULT_BASE_URL
    return base.rstrip("/") + "/" + download


def fetch_dataset(download: str, root: Path, sha256: str | None, name: str) -> Path:
    """Make `root` hold the extracted dataset; raises DataError with one line on any failure."""
    url = dataset_url(download)
    check_dataset_target(root, name)  # an existing folder outside the cache is never moved aside
    root.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp-", dir=root.parent))
    try:
        archive = work / "download.zip"
        log.info("%s: downloading %s", name, url)
        digest = _download(url, archive, name, root)
        if sha256 and digest != sha256.lower():
            raise DataError(f"{name}: checksum mismatch for {url} (sha256 {digest[:16]}..., "
                            f"expected {sha256[:16]}...); place a good copy at {root}")
        if not sha256:
            log.warning("%s: no sha256 known for %s; the archive was not verified", name, url)
        extracted = work / "extracted"
        _safe_extract(archive, extracted, name)
        _move_into_place(extracted, root)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log.info("%s: ready at %s", name, root)
    return root


def _download(url: str, dest: Path, name: str, root: Path) -> str:
    """Stream `url` to `dest` and return its sha256 hex digest."""
    h = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp, open(dest, "wb") as f:
            while chunk := resp.read(1 << 20):
                h.update(chunk)
                f.write(chunk)
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        if root.suffix in (".pt", ".pth"):  # a weights file
            raise DataError(f"could not download {url} ({reason}); place the file at {root} yourself") from None
        raise DataError(f"{name}: could not download {url} ({reason}); place the dataset at "
                        f"{root} yourself, or use data=shapes (built in, no download)") from None
    return h.hexdigest()


def download_file(url: str, dest: Path) -> Path:
    """Download `url` to `dest` through a temp file + rename; one-line DataError on failure."""
    with atomic_path(dest, suffix=".part") as tmp:
        _download(url, tmp, dest.name, dest)
    return dest


def _safe_extract(archive: Path, dest: Path, name: str) -> None:
    try:
        with zipfile.ZipFile(archive) as zf:
            members = zf.infolist()
            for m in members:
                p = PurePosixPath(m.filename.replace("\\", "/"))
                if p.is_absolute() or ".." in p.parts or (p.parts and ":" in p.parts[0]):
                    raise DataError(f"{name}: refusing to extract unsafe path "
                                    f"'{m.filename}' from the downloaded archive")
            zf.extractall(dest)
    except zipfile.BadZipFile:
        raise DataError(f"{name}: the downloaded file is not a valid zip archive") from None


def _move_into_place(extracted: Path, root: Path) -> None:
    """Rename the dataset folder to `root`. A zip holding one top folder (coco128.zip holds
    `coco128/`) contributes that folder; otherwise the whole extraction is the dataset."""
    entries = [p for p in extracted.iterdir() if p.name != "__MACOSX"]
    source = entries[0] if len(entries) == 1 and entries[0].is_dir() else extracted
    if root.exists():
        # Something is there but lacked the split folders (an earlier partial copy by hand):
        # keep it aside rather than deleting user files.
        aside = root.with_name(f"{root.name}.old-{uuid.uuid4().hex[:6]}")
        os.rename(root, aside)
        log.warning("moved the incomplete %s aside to %s", root, aside)
    os.rename(source, root)
