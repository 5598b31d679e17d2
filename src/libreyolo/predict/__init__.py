"""Use a trained model: `LibreYOLO(path).predict(source)` (model.py) and `libreyolo predict`.

sources.py reads what a user points at (files, folders, globs, videos, arrays); core.py runs the
model with validation's transforms (post.py) and an optional CUDA graph (graph.py); results.py is
what comes back; draw.py annotates and saves.
"""
