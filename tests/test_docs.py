"""The user's documentation keeps up with the code: README.md and docs/ name files that exist
and keys that the config has; docs/configuration.md is generated from config/schema.py and
current; the exit-code table is ExitCode's; every command the README names answers --help; the
API example sets XLA_FLAGS before importing ptdp_jax; `make demo` installs no torch."""
import dataclasses
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from ptdp_jax.config.schema import Config
from ptdp_jax.exits import ExitCode

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DOCS = {p.name: p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))}
PAGES = {"README.md": README, **{f"docs/{name}": text for name, text in DOCS.items()}}
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}


def config_keys(cls=Config, prefix=""):
    """Every dotted key of the config tree (the sections' fields)."""
    for f in dataclasses.fields(cls):
        if f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory):
            yield from config_keys(f.default_factory, f"{prefix}{f.name}.")
        else:
            yield prefix + f.name


@pytest.mark.parametrize("word", [
    "model.num_kv_heads", "train.decay_steps", "train.stop_at_step", "train.stop_after_minutes",
    "tuning.skip_memory_check", "train.sample_tokens", "train.dtype=auto", "train.recompute=auto",
    "checkpoint.resume=overwrite", "parallel.sequence_parallel", "parallel.layout=auto", "ptdp-eval",
    "ptdp-generate", "--print-config", "--dry-run", "llama3-8b", "did you mean",
])
def test_docs_mention(word):
    assert any(word in text for text in PAGES.values()), word


@pytest.mark.parametrize("page", sorted(PAGES))
def test_docs_point_inside_the_project(page):
    text = PAGES[page]
    for link in re.findall(r"\]\(([^)#]+)", text):     # relative links stay in the tree, and exist
        if "://" not in link:
            target = ((ROOT / page).parent / link).resolve()
            assert target.is_relative_to(ROOT.resolve()) and target.exists(), link
    assert not re.search(r"\.\./shared", text)
    for path in re.findall(r"`((?:ptdp_jax|configs|tests|benchmarks|docs)/[\w./-]+\.(?:py|yaml|md|png))`",
                           text):
        assert (ROOT / path).exists(), path
    for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):     # pictures, relative to the page
        assert (ROOT / page).parent.joinpath(image).exists(), image


@pytest.mark.parametrize("page", sorted(PAGES))
def test_docs_hold_no_history(page):
    """A user's guide: no per-run history, no issue numbers, no word of the tree rules."""
    text = PAGES[page]
    assert not re.search(r"\bsessions?\b", text, re.IGNORECASE)
    assert not re.search(r"\bissues? \d+|(?<![\w&])#\d+\b", text, re.IGNORECASE)


def _paragraphs(text: str) -> list[str]:
    """Paragraphs and list items, each on one line."""
    parts = re.split(r"\n\s*\n|\n(?=\s*- )", text)
    return [" ".join(p.split()) for p in parts]


@pytest.mark.parametrize("page", sorted(PAGES))
def test_a_signals_checkpoint_is_said_to_need_checkpoint_dir(page):
    """Where a page says SIGTERM (or a stop) writes a checkpoint, it says that needs
    checkpoint.dir: without one nothing is saved."""
    for para in _paragraphs(PAGES[page]):
        if re.search(r"SIGTERM.*(writes a checkpoint|checkpoint is written|checkpoint was "
                     r"written)", para):
            assert "checkpoint.dir" in para, para


def test_the_quick_tests_time_is_the_measured_one():
    """`make test` took 11 min 15 s on a 2-core AMD EPYC (AVX2) on 2026-12-03, not the
    "about 5 minutes" the README and the Makefile said."""
    makefile = (ROOT / "Makefile").read_text()
    for text in (README, makefile):
        timed = [ln for ln in text.splitlines() if re.search(r"make test\s", ln)
                 and re.search(r"\d+ min", ln)]
        assert timed and all("11 min 15 s" in ln for ln in timed), timed
        assert "about 5 minutes" not in text and "AMD EPYC" in text and "2026-12-03" in text


def test_the_planners_time_is_the_measured_one():
    """ptdp-plan searches for 20-70 s, not 'seconds'."""
    assert "CPU only, seconds" not in DOCS["planner.md"]
    assert "20–70 s" in DOCS["planner.md"]


def test_the_bpe_example_names_every_file_it_writes():
    """A BPE run of ptdp-prepare-data writes PREFIX.tokenizer.json beside the token files."""
    example = README[README.index("ptdp-prepare-data corpus/"):]
    example = example[:example.index("```")]
    for ending in (".bin", ".idx.npy", ".json", ".tokenizer.json"):
        assert f"data/mycorpus{ending}" in example, ending


def test_readme_is_short():
    assert len(README.splitlines()) <= 300


def test_exit_code_table_is_the_enum():
    rows = re.findall(r"^\| (\d+) \| `(\w+)` \|", DOCS["troubleshooting.md"], re.MULTILINE)
    assert {int(code): name for code, name in rows} == {c.value: c.name for c in ExitCode}


UNSAID = ("train.log_every", "train.eval_batches", "train.grad_clip", "train.seed",
          "model.init_std", "data.val_fraction", "checkpoint.keep")


@pytest.mark.parametrize("key", UNSAID)
def test_keys_whose_name_does_not_say_it_have_a_meaning(key):
    """configuration.md's row of each key whose effect its name does not tell holds a meaning
    (train.log_every had none: the means over how many steps, where they go)."""
    row = re.search(rf"^\| `{re.escape(key)}` \|[^|]*\|[^|]*\|(.*)\|$",
                    DOCS["configuration.md"], re.MULTILINE)
    assert row and row.group(1).strip(), key


def test_configuration_reference_is_current():
    r = subprocess.run([sys.executable, "docs/make_configuration.py", "--check"], cwd=ROOT,
                       env=ENV, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_every_config_key_is_documented():
    text = DOCS["configuration.md"]
    missing = [k for k in config_keys() if f"`{k}`" not in text]
    assert not missing, missing


def test_readme_names_every_command():
    named = set(re.findall(r"\bptdp-[a-z]+(?:-[a-z]+)*", README))
    assert named == set(SCRIPTS), named ^ set(SCRIPTS)


@pytest.mark.parametrize("command", sorted(set(re.findall(r"\bptdp-[a-z]+(?:-[a-z]+)*", README))))
def test_readme_commands_answer_help(command):
    assert command in SCRIPTS, f"{command} is not a [project.scripts] entry of pyproject.toml"
    module = SCRIPTS[command].split(":")[0]
    r = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: {command}"), r.stdout[:200]


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


@pytest.mark.parametrize("page", sorted(PAGES))
def test_docs_globs_inside_the_project_match_files(page):
    """An example such as `ptdp-prepare-data docs/*.txt` that names the project's own files
    runs as written: each glob under a project folder matches at least one file."""
    for pattern in re.findall(r"\b(?:ptdp_jax|configs|tests|benchmarks|docs)/[\w./-]*\*[\w.*/-]*",
                              PAGES[page]):
        assert any(ROOT.glob(pattern)), f"{page}: {pattern} matches no file"
