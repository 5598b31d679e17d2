"""LibreYOLO: train object detectors fast, and know why a run is slow."""

from .version import __version__

__all__ = ["LibreYOLO", "__version__"]


def __getattr__(name: str):
    # Lazy: `import libreyolo` (and so every CLI call) stays fast until a model is needed.
    if name == "LibreYOLO":
        from .model import LibreYOLO

        return LibreYOLO
    raise AttributeError(f"module 'libreyolo' has no attribute '{name}'")
