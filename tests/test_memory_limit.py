"""One memory limit: the commands set the share of a GPU's memory that JAX's allocator takes
to the one ptdp-plan plans with (decisions.MEMORY_FRACTION) before the backend starts, unless
the user set an allocator variable; a refusal says where the limit comes from."""
import os

import pytest

from ptdp_jax.cli.plan import planned_fraction
from ptdp_jax.config import decisions as D
from ptdp_jax.config import memory_limit as ML
from ptdp_jax.plan.hardware import gpu_kind


def test_the_commands_set_the_planned_fraction_unless_the_user_set_one():
    env = {}
    assert ML.use_planned_fraction(env) == D.MEMORY_FRACTION
    assert env == {"XLA_PYTHON_CLIENT_MEM_FRACTION": str(D.MEMORY_FRACTION)}
    for var, value in (("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5"),
                       ("XLA_PYTHON_CLIENT_PREALLOCATE", "false"),
                       ("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")):
        env = {var: value}
        assert ML.use_planned_fraction(env) is None and env == {var: value}


def test_ptdp_train_sets_it_before_the_backend_starts(monkeypatch, capsys):
    from ptdp_jax.cli.train import main
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    monkeypatch.setattr(ML, "_SET_HERE", False)
    assert main(["configs/tiny-gpt.yaml", "--print-config"]) == 0
    assert os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] == str(D.MEMORY_FRACTION)
    assert ML.fraction_in_use() == (D.MEMORY_FRACTION, "set by ptdp_jax's commands")


def test_the_planner_plans_with_the_same_fraction():
    assert gpu_kind("h200").usable_memory_fraction == D.MEMORY_FRACTION
    assert gpu_kind("h100").usable_memory_fraction == D.MEMORY_FRACTION
    assert planned_fraction({}) == {}
    assert planned_fraction({"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.8"}) == {
        "usable_memory_fraction": 0.8}


@pytest.mark.parametrize("env,words", [
    ({}, "XLA_PYTHON_CLIENT_MEM_FRACTION=0.75 of the device's memory (JAX's default)"),
    ({"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.6"},
     "XLA_PYTHON_CLIENT_MEM_FRACTION=0.6 of the device's memory (as set in the environment)")])
def test_a_refusal_names_the_limit_and_how_to_change_it(env, words, monkeypatch):
    monkeypatch.setattr(ML, "_SET_HERE", False)
    text = ML.limit_words("gpu", env)
    assert words in text and "set XLA_PYTHON_CLIENT_MEM_FRACTION" in text
    assert ML.limit_words("cpu", env) == ""


def test_ptdp_plan_prints_the_limit_it_plans_with(monkeypatch, capsys):
    from ptdp_jax.cli.plan import main
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.8")
    assert main(["configs/gpt-1.7b.yaml", "--gpus", "8", "--gpu", "h200", "--top", "1"]) == 0
    assert "limit 80%" in capsys.readouterr().out
