"""The Python API prints the lines the CLI prints, unless the program configured logging itself."""

import contextlib
import logging

from libreyolo import LibreYOLO
from libreyolo.logs import LOGGER


@contextlib.contextmanager
def unconfigured():
    """A program that configured no logging: pytest's own handlers (added for each test phase,
    so this runs inside the test) set aside while it lasts."""
    root, logger = logging.getLogger(), logging.getLogger(LOGGER)
    saved = root.handlers, logger.handlers, logger.propagate, logger.level
    root.handlers, logger.handlers, logger.propagate, logger.level = [], [], True, logging.NOTSET
    try:
        yield logger
    finally:
        root.handlers, logger.handlers, logger.propagate, logger.level = saved


def test_a_script_sees_the_cli_lines_on_stderr(capsys):
    with unconfigured():
        LibreYOLO("yolo9-t")
        logging.getLogger(LOGGER).info("training YOLOv9-t on shapes; precision: float32")
        captured = capsys.readouterr()
        LibreYOLO("yolo9-t")  # once: a second model adds no second handler
        logging.getLogger(LOGGER).info("again")
        again = capsys.readouterr().err
    assert captured.err == "training YOLOv9-t on shapes; precision: float32\n" and captured.out == ""
    assert again == "again\n"


def test_a_program_that_configured_logging_keeps_it():
    with unconfigured() as logger:
        mine = logging.NullHandler()
        logging.getLogger().handlers.append(mine)
        LibreYOLO("yolo9-t")
        assert logger.handlers == [] and logging.getLogger().handlers == [mine]


def test_counted_spells_one_and_many():
    from libreyolo.logs import counted

    assert (counted(1, "epoch"), counted(0, "image"), counted(3, "time")) == ("1 epoch", "0 images", "3 times")
