"""parallel.layout=auto: training takes the planner's layout for the devices at hand; the
user's explicit layout keys win."""
import jax
import pytest

from ptdp_jax.config import ConfigError
from ptdp_jax.train import auto_layout, resolve_config, train

TINY = {"model.num_layers": 4, "model.hidden_size": 32, "model.num_heads": 4, "model.seq_len": 16,
        "train.global_batch_size": 8, "train.micro_batch_size": 1, "train.steps": 2,
        "train.eval_every": 0, "run.progress": False, "run.tensorboard": False,
        "parallel.layout": "auto"}


def test_auto_layout_picks_a_valid_layout_and_trains(tmp_path):
    ov = dict(TINY, **{"run.dir": str(tmp_path / "run")})
    cfg = auto_layout(resolve_config(None, None, ov), ov, log=lambda *a: None)
    d, p, t = cfg.parallel.mesh_shape
    assert d * p * t <= len(jax.devices())
    assert cfg.parallel.layout == "auto" and (d, p, t) != (1, 1, 1)   # 8 devices get used
    res = train(None, overrides=ov, log=lambda *a, **k: None)
    assert len(res.losses) == 2 and all(l == l for l in res.losses)


def test_explicit_keys_win():
    ov = dict(TINY, **{"parallel.pipe": 2, "train.recompute": "full"})
    cfg = auto_layout(resolve_config(None, None, ov), ov, log=lambda *a: None)
    assert cfg.parallel.pipe == 2 and cfg.train.recompute == "full"
    cfg = auto_layout(resolve_config(None, (2, 1, 2), TINY), TINY, mesh_shape=(2, 1, 2),
                      log=lambda *a: None)
    assert cfg.parallel.mesh_shape == (2, 1, 2)


def test_manual_is_untouched_and_bad_value_is_refused():
    ov = dict(TINY, **{"parallel.layout": "manual"})
    cfg = resolve_config(None, None, ov)
    assert auto_layout(cfg, ov) is cfg
    from ptdp_jax.validation import validate
    with pytest.raises(ConfigError, match="parallel.layout"):
        validate(resolve_config(None, None, dict(TINY, **{"parallel.layout": "best"})))
