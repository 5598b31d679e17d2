#!/usr/bin/env bash
# Regenerates the README's screenshots (needs tmux and chromium; CPU is enough):
#   docs/img/train_terminal.png  a `libreyolo train` in a real terminal (tmux), mid-epoch
#   docs/img/results_html.png    the results.html of a 40-epoch run on shapes at 128 px
# Usage: docs/img/screenshots.sh [RUN_DIR]   (RUN_DIR: an existing run whose results.html to
# photograph instead of training one)
set -euo pipefail
IMG="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$IMG/../.." && pwd)"
export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}"  # this tree's code, whatever is pip-installed
WORK="$(mktemp -d)"
trap 'tmux kill-session -t libreyolo-shot 2>/dev/null || true; rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=1  # tiny CPU runs: one intra-op thread is the fastest on a shared machine
CHROME=(chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run
        --disable-background-networking --virtual-time-budget=20000 "--user-data-dir=$WORK/chromium")

# 1. The terminal: three short epochs, photographed while the third one runs.
tmux new-session -d -s libreyolo-shot -x 132 -y 14 -c "$WORK" \
  "env PYTHONPATH=$PYTHONPATH OMP_NUM_THREADS=1 python3 -m libreyolo train model=yolo9-t data=shapes epochs=3 \
   imgsz=128 batch=8 nbs=8 device=cpu workers=0 log_interval=2; sleep 60"
for _ in $(seq 600); do
  if tmux capture-pane -p -t libreyolo-shot | grep -Eq "epoch 3/3 .* ([4-9]|1[0-2])/16"; then break; fi
  sleep 0.1
done
tmux capture-pane -e -p -t libreyolo-shot > "$WORK/pane.ansi"
# The pane as HTML (rich's own export); prints the window height the picture needs.
cat > "$WORK/to_html.py" <<'PY'
import re
import sys

from rich.console import Console
from rich.terminal_theme import MONOKAI
from rich.text import Text

ansi = open(sys.argv[1]).read().strip("\n")
ansi = re.sub(r"\x1b\[(?:4[0-9]|10[0-7]|48;5;\d+|48;2;\d+;\d+;\d+)m", "", ansi)  # tmux's backgrounds: the theme's
console = Console(record=True, width=132, file=open("/dev/null", "w"), force_terminal=True)
console.print(Text.from_ansi(ansi))
page = console.export_html(theme=MONOKAI, inline_styles=True)
open(sys.argv[2], "w").write(page.replace("<body>", "<body style='margin:0;padding:12px;background:#272822'>"))
print(30 + 19 * (ansi.count("\n") + 1))
PY
HEIGHT=$(python3 "$WORK/to_html.py" "$WORK/pane.ansi" "$WORK/pane.html")
"${CHROME[@]}" --window-size=1300,"$HEIGHT" --screenshot="$IMG/train_terminal.png" "file://$WORK/pane.html"

# 2. The page: a run long enough for the curves to mean something.
RUN="${1:-}"
if [[ -z "$RUN" ]]; then
  (cd "$WORK" && python3 -m libreyolo train model=yolo9-t data=shapes epochs=40 imgsz=128 batch=8 nbs=8 \
     device=cpu workers=0 name=demo >/dev/null)
  RUN="$WORK/runs/train/demo"
fi
"${CHROME[@]}" --window-size=1280,2350 --screenshot="$IMG/results_html.png" "file://$(cd "$RUN" && pwd)/results.html"
echo "wrote $IMG/train_terminal.png $IMG/results_html.png"
