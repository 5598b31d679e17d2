"""The GPU suite's lanes (tests/gpu/conftest.py): every GPU test file in exactly one lane, and
`--lane` collects that lane's files alone (collected here on a CPU: the tests themselves skip)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

GPU = Path(__file__).resolve().parents[1] / "gpu"


def _lanes() -> dict[str, tuple[str, ...]]:
    spec = importlib.util.spec_from_file_location("gpu_conftest", GPU / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.LANES


def test_every_gpu_test_file_is_in_exactly_one_lane():
    lanes = _lanes()
    listed = [name for files in lanes.values() for name in files]
    assert len(listed) == len(set(listed)), "a file in two lanes"
    assert set(listed) == {p.name for p in GPU.glob("test_*.py")}, "a GPU test file in no lane, or a lane naming none"


def _collect(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "gpu",
                           str(GPU), *args], capture_output=True, text=True, cwd=GPU.parents[1], timeout=300)


def test_a_lane_collects_its_own_files_and_an_unknown_lane_is_refused():
    lanes = _lanes()
    proc = _collect("--lane", "profiler")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    files = {line.split("::")[0].rsplit("/", 1)[-1] for line in proc.stdout.splitlines() if "::" in line}
    assert files == set(lanes["profiler"])
    bad = _collect("--lane", "nope")
    assert bad.returncode == 4 and "invalid choice: 'nope'" in bad.stderr
