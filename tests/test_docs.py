"""The README keeps up with the code (issue 15): the new keys and commands are in it, it
points at no file outside the project, its exit codes are ExitCode's, its API example sets
XLA_FLAGS before importing ptdp_jax; `make demo` installs no torch or transformers."""
import re
import subprocess
from pathlib import Path

import pytest

from ptdp_jax.exits import ExitCode

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


@pytest.mark.parametrize("word", [
    "model.num_kv_heads", "train.decay_steps", "train.stop_at_step", "train.stop_after_minutes",
    "train.skip_memory_check", "train.sample_temperature", "train.sample_top_k",
    "checkpoint.overwrite", "parallel.sequence_parallel", "ptdp-eval", "ptdp-generate", "--print-config", "--dry-run",
    "llama3-8b", "peak_mem_gib", "did you mean",
])
def test_readme_mentions(word):
    assert word in README


def test_readme_points_inside_the_project():
    assert not re.search(r"\.\./", README)
    for path in re.findall(r"`((?:ptdp_jax|configs|tests|benchmarks|docs)/[\w./-]+\.(?:py|yaml|md|png))`",
                           README):
        assert (ROOT / path).exists(), path


def test_readme_exit_codes_are_the_enum():
    text = README.split("**Exit codes**", 1)[1].split("\n\n", 1)[0]
    listed = {int(n) for n in re.findall(r"(?<![\w.])(\d+) [a-z`]", text)}
    assert listed == {int(c) for c in ExitCode}, listed


def test_api_example_sets_xla_flags_first():
    block = README.split("```python", 1)[1].split("```", 1)[0]
    assert block.index("XLA_FLAGS") < block.index("from ptdp_jax import train")
    assert '"run.dir"' in block                          # not the demo's runs/demo


def test_make_demo_does_not_install_torch():
    def commands(target):
        r = subprocess.run(["make", "-n", "-B", target], cwd=ROOT, capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        return r.stdout
    assert "export-test" not in commands("demo") and "torch" not in commands("demo")
    assert "export-test" in commands("test")
