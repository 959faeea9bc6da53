"""train.lr_schedule: the value of each schedule at chosen steps, the default (cosine) the
same as before, a warm-up longer than the run keeping its length, the keys validated, and a
stopped and resumed wsd run on the same schedule as an uninterrupted one."""
import json
from pathlib import Path

import optax
import pytest

import helpers_ckpt as H
from ptdp_jax.config.load import ConfigError, load_config
from ptdp_jax.training.state import lr_schedule
from ptdp_jax.run.loop import train
from ptdp_jax.config.validation import validate

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def sched(kind, **extra):
    cfg = load_config(overrides={"train.lr": 1.0, "train.warmup_steps": 4, "train.steps": 10,
                                 "train.min_lr_ratio": 0.1, "train.lr_schedule": kind, **extra})
    lr = lr_schedule(cfg)
    return lambda k: float(lr(k))


@pytest.mark.parametrize("kind, expect", [
    # the update of step k runs at the schedule's value at k + 1; warm-up: 0.25 a step
    ("cosine", {0: 0.25, 3: 1.0, 6: 0.55, 9: 0.1, 50: 0.1}),
    ("linear", {0: 0.25, 3: 1.0, 4: 0.85, 6: 0.55, 9: 0.1, 50: 0.1}),
    ("constant", {0: 0.25, 3: 1.0, 6: 1.0, 9: 1.0, 50: 1.0}),
])
def test_schedule_values(kind, expect):
    lr = sched(kind)
    assert {k: lr(k) for k in expect} == pytest.approx(expect)


def test_wsd_values():
    """Warm-up 2, constant, then linear over the last quarter (5 steps) of 20."""
    lr = sched("wsd", **{"train.warmup_steps": 2, "train.steps": 20, "train.decay_fraction": 0.25})
    expect = {0: 0.5, 1: 1.0, 8: 1.0, 14: 1.0, 15: 0.82, 17: 0.46, 19: 0.1, 40: 0.1}
    assert {k: lr(k) for k in expect} == pytest.approx(expect)
    # decay_steps, not train.steps, sets where it ends
    longer = sched("wsd", **{"train.warmup_steps": 2, "train.steps": 30, "train.decay_steps": 20,
                             "train.decay_fraction": 0.25})
    assert all(longer(k) == lr(k) for k in range(30))


@pytest.mark.parametrize("warmup, decay, steps", [(4, None, 10), (0, None, 7), (20, None, 200),
                                                  (3, 12, 40), (5, 5, 5)])
def test_default_is_the_cosine_of_before(warmup, decay, steps):
    """Default train.lr_schedule=cosine: bit for bit optax's warm-up + cosine as it was built
    before the other schedules (where the warm-up is no longer than the decay)."""
    assert load_config().train.lr_schedule == "cosine"
    cfg = load_config(overrides={"train.lr": 3e-3, "train.warmup_steps": warmup,
                                 "train.steps": steps, "train.decay_steps": decay})
    end = decay or steps
    warm = min(warmup, end)
    old = optax.warmup_cosine_decay_schedule(0.0, 3e-3, warmup_steps=warm,
                                             decay_steps=max(end, warm + 1), end_value=3e-4)
    lr = lr_schedule(cfg)
    assert [float(lr(k)) for k in range(steps + 5)] == [float(old(k + 1)) for k in range(steps + 5)]


@pytest.mark.parametrize("kind", ["cosine", "linear", "constant", "wsd"])
def test_warmup_longer_than_the_run_keeps_its_length(kind):
    """A 5-step run of a 2000-step warm-up ramps as the long run would: a tiny lr."""
    lr = sched(kind, **{"train.warmup_steps": 2000, "train.steps": 5})
    assert [lr(k) for k in range(5)] == pytest.approx([(k + 1) / 2000 for k in range(5)], rel=1e-4)
    assert lr(1999) == pytest.approx(1.0)                      # the warm-up's last step
    assert lr(2000) == pytest.approx(1.0 if kind == "constant" else 0.1)


@pytest.mark.parametrize("key, value, words", [
    ("train.lr_schedule", "step", "train.lr_schedule='step' is not one of"),
    ("train.decay_fraction", 0.0, "train.decay_fraction must be in (0, 1]"),
    ("train.decay_fraction", 1.5, "train.decay_fraction must be in (0, 1]"),
])
def test_bad_values_are_refused(key, value, words):
    with pytest.raises(ConfigError) as e:
        validate(load_config(overrides={key: value}))
    assert words in str(e.value)


def test_resumed_wsd_run_keeps_the_schedule(tmp_path, data_cache):
    """wsd over 4 steps, its decay in the last 2: stopped at step 2 and resumed, the losses
    and learning rates are those of an uninterrupted run (the optimizer's step count is in
    the checkpoint)."""
    ov = H.tiny(tmp_path, data_cache, **{"model.num_layers": 2, "train.steps": 4,
                                         "train.lr_schedule": "wsd", "train.decay_fraction": 0.5,
                                         "train.lr": 1e-2})
    base = train(mesh_shape=(1, 1, 1), overrides={**ov, "checkpoint.dir": ""}, log=H.Log())
    first = train(mesh_shape=(1, 1, 1), overrides={**ov, "train.stop_at_step": 2}, log=H.Log())
    second = train(mesh_shape=(1, 1, 1), overrides=ov, log=H.Log())
    assert second.start_step == 2 and first.losses + second.losses == base.losses
    lrs = [json.loads(line)["lr"] for line in (Path(tmp_path) / "run" / "metrics.jsonl")
           .read_text().splitlines() if "lr" in json.loads(line)]
    assert lrs[:4] == lrs[4:] == pytest.approx([1e-2, 1e-2, 5.5e-3, 1e-3])
