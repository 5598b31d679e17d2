"""The real `libreyolo train` in a pseudo-terminal: a live bar per epoch on stderr, the result on
stdout. (Without a terminal the same run prints plain lines: tests/cli/test_train_cli.py.)"""

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time

ARGS = ["train", "model=yolo9-t", "data=shapes", "device=cpu", "workers=0", "amp=false", "imgsz=64", "batch=8",
        "epochs=1", "val=false", "log_interval=4"]


def run_in_pty(argv: list[str], cwd, timeout: float = 300) -> tuple[int, str, str]:
    """(exit code, what stderr showed on the terminal, stdout) of a command whose stderr is a pty."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))  # rows, columns
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE",
                                                            "TTY_INTERACTIVE", "COLUMNS", "LINES")}
    # One intra-op thread: a 64 px step gains nothing from more, and on a busy 2-core runner the
    # spinning OpenMP threads made this 1.5 s epoch take 40 s (tests/conftest.py, `one_thread`).
    env.update(TERM="xterm-256color", LIBREYOLO_DEBUG="", OMP_NUM_THREADS="1")
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)  # the child holds the only other end: reading ends with EIO when it exits
    chunks, deadline = [], time.time() + timeout
    while time.time() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if not ready:
            continue
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child's end is closed
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    out = proc.stdout.read().decode()
    proc.stdout.close()
    code = proc.wait(timeout=60)
    return code, b"".join(chunks).decode("utf-8", "replace"), out


def test_train_shows_a_live_bar_in_a_terminal(cli_command, tmp_path):
    code, shown, out = run_in_pty([*cli_command, *ARGS], tmp_path)
    assert code == 0, shown[-3000:]
    assert out.strip().endswith("exp/weights/last.pt")  # the result alone on stdout
    assert "\x1b[" in shown  # drawn with terminal control codes, redrawn in place
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown)
    assert "training YOLOv9-t on shapes" in text and "precision: float32" in text  # log lines above the bar
    assert re.search(r"epoch 1/1 .*\b([0-9]|1[0-5])/16\b", text), text[-2000:]  # drawn before the epoch ended
    final = [ln for ln in text.splitlines() if "16/16" in ln]
    assert final, text[-2000:]
    assert re.search(r"epoch 1/1 .*16/16 .*box \d.*cls \d.*dfl \d.*\d+ img/s .*ETA", final[-1]), final[-1]
    assert (tmp_path / "runs" / "train" / "exp" / "results.html").is_file()  # val=false: training curves only


def test_predict_on_a_folder_shows_a_bar_in_a_terminal(cli_command, tmp_path):
    import torch
    from torchvision.io import write_png

    (tmp_path / "imgs").mkdir()
    for i in range(6):
        write_png(torch.full((3, 40, 60), 40 * i, dtype=torch.uint8), str(tmp_path / "imgs" / f"{i}.png"))
    code, shown, out = run_in_pty([*cli_command, "predict", "model=yolo9-t", "source=imgs", "imgsz=64",
                                   "device=cpu", "save=false", "--json"], tmp_path)
    assert code == 0, shown[-3000:]
    assert len(out.splitlines()) == 6 and all(line.startswith("{") for line in out.splitlines())  # JSON alone
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown)
    assert "\x1b[" in shown and "predicting" in text and "6/6" in text, text[-2000:]
    assert "done: 6 images" in text
