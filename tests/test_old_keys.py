"""Configs of earlier versions keep working (config.migrate): a YAML file, a dotted override or a
checkpoint's saved config that names a removed or moved key loads with one ConfigWarning naming
what replaced it; a moved key carries its value (to tuning.*, train.adam_betas,
checkpoint.resume); a value that can no longer be honoured is a ConfigError naming the key
(a checkpoint's saved config is never refused: its run was made); resuming a checkpoint whose
saved config has the old keys is unaffected."""
import json
import warnings

import pytest

import helpers_ckpt as H
from ptdp_jax.checkpoint import manager as CK
from ptdp_jax.config.load import (GONE, MOVED, ConfigError, ConfigWarning, all_keys, load_config,
                             parse_cli_overrides, to_yaml)
from ptdp_jax.run.loop import train

OLD_YAML = """\
model: {arch: gpt, attention: xla}
train:
  beta1: 0.8
  beta2: 0.99
  keep_ffn_activation: false
  scan_layers: true
  skip_memory_check: true
  dispatch_ahead: false
  max_bad_steps: 5
  sample_prompt: "The "
parallel:
  static_stash: false
  overlap_grad_reduce: auto
  tp_comm_overlap: false
  allow_cross_host_tensor: true
  empty_buffers: false
  overlap_p2p: true
  zero_ring: auto
  tp_overlap_sends: ring
  nccl_channels: 32
data: {cache_dir: ~/.cache/ptdp_jax}
checkpoint: {resume: false, overwrite: true}
run: {progress: false, tensorboard: false}
"""


def one_warning(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn()
    ours = [w for w in caught if issubclass(w.category, ConfigWarning)]
    assert len(ours) == 1, [str(w.message) for w in ours]
    return out, str(ours[0].message)


def test_an_old_yaml_loads_with_one_warning_and_its_values_moved(tmp_path):
    f = tmp_path / "old.yaml"
    f.write_text(OLD_YAML)
    cfg, text = one_warning(lambda: load_config(f))
    assert text.startswith(f"config file '{f}': keys of an earlier version: ")
    for old, new in MOVED.items():
        assert f"{old} is now {new}" in text
    for old, why in GONE.items():
        assert f"{old} is gone: {why}" in text
    assert "train.beta1 and train.beta2 are now train.adam_betas" in text
    assert "checkpoint.overwrite=true is now checkpoint.resume=overwrite" in text
    tu = cfg.tuning
    assert (tu.attention, tu.keep_ffn_activation, tu.scan_layers, tu.skip_memory_check) == \
        ("xla", False, True, True)
    assert (tu.static_stash, tu.overlap_grad_reduce, tu.tp_comm_overlap,
            tu.allow_cross_host_tensor) == (False, "auto", False, True)
    assert cfg.train.adam_betas == (0.8, 0.99) and cfg.checkpoint.resume == "overwrite"


def test_an_old_override_loads_with_one_warning():
    ov = parse_cli_overrides(["parallel.static_stash=false", "parallel.zero_ring=true",
                              "train.beta2=0.98"])
    cfg, text = one_warning(lambda: load_config(overrides=ov))
    assert text.startswith("the overrides: keys of an earlier version: ")
    assert "parallel.static_stash is now tuning.static_stash" in text
    assert "parallel.zero_ring is gone" in text
    assert cfg.tuning.static_stash is False and cfg.train.adam_betas == (0.9, 0.98)
    new = load_config(overrides={"tuning.static_stash": False, "train.adam_betas": [0.9, 0.98]})
    assert new == cfg


@pytest.mark.parametrize("key, value, words", [
    ("train.max_bad_steps", 10, "a run stops after 5 non-finite steps in a row"),
    ("data.cache_dir", "/elsewhere", "$PTDP_CACHE_DIR"),
    ("train.sample_temperature", 0.0, "temperature 0.6, top-k 20"),
    ("train.sample_top_k", 5, "temperature 0.6, top-k 20"),
    ("train.sample_prompt", "Once", "starts from 'The '"),
])
def test_a_value_that_cannot_be_honoured_is_refused(key, value, words, tmp_path):
    with pytest.raises(ConfigError, match=rf"{key}={value!r} can no longer be set: .*"):
        load_config(overrides={key: value})
    section, name = key.split(".")
    f = tmp_path / "c.yaml"
    f.write_text(f"model: {{num_layers: 2}}\n{section}:\n  {name}: {json.dumps(value)}\n")
    with pytest.raises(ConfigError) as e:
        load_config(f)
    assert f"config file '{f}', line 3: {key}=" in str(e.value) and words in str(e.value)


def _old_dict(cfg) -> dict:
    """cfg's dict as an earlier version saved it: no tuning section, the old keys."""
    tree = cfg.to_dict()
    tree.pop("tuning")
    tree["model"]["attention"] = "auto"
    tree["train"].pop("adam_betas")
    tree["train"].update(beta1=0.9, beta2=0.95, keep_ffn_activation="auto", scan_layers="auto",
                         skip_memory_check=False, dispatch_ahead=True, max_bad_steps=7,
                         sample_prompt="Once", sample_temperature=0.0, sample_top_k=0,
                         dtype="float32", recompute="none")
    tree["parallel"].update(static_stash="auto", overlap_grad_reduce="auto",
                            tp_comm_overlap="auto", allow_cross_host_tensor=False,
                            empty_buffers=True, overlap_p2p="auto", zero_ring=False,
                            tp_overlap_sends="direct", nccl_channels="auto")
    tree["data"]["cache_dir"] = "/somewhere/else"
    tree["checkpoint"]["overwrite"] = False
    tree["run"].update(progress=True, tensorboard=True)
    return tree


def test_a_saved_config_with_old_keys_loads(tmp_path):
    cfg = load_config(overrides=H.tiny(tmp_path, tmp_path))
    back, text = one_warning(lambda: CK.config_from_dict(_old_dict(cfg)))
    assert "train.max_bad_steps is gone" in text and "data.cache_dir is gone" in text
    assert back.model == cfg.model and back.train.adam_betas == (0.9, 0.95)


def test_resuming_a_checkpoint_saved_with_old_keys(tmp_path, data_cache):
    ov = H.tiny(tmp_path, data_cache, **{"train.steps": 2, "model.num_layers": 2})
    first = train(mesh_shape=(1, 1, 1), overrides=ov, log=H.Log())
    meta = tmp_path / "ckpt" / "2" / "meta" / "ptdp_meta.json"
    saved = json.loads(meta.read_text())
    saved["config"] = _old_dict(first.config)
    meta.write_text(json.dumps(saved))
    res, text = one_warning(lambda: train(mesh_shape=(1, 1, 1), log=H.Log(),
                                          overrides={**ov, "train.steps": 3}))
    assert res.start_step == 2 and len(res.losses) == 1
    assert text.startswith("a checkpoint's saved config: keys of an earlier version: ")


def test_print_config_shows_every_key(capsys):
    from ptdp_jax.cli.train import main
    assert main(["--print-config"]) == 0
    text = capsys.readouterr().out
    import yaml
    from ptdp_jax.config.load import flatten
    assert sorted(flatten(yaml.safe_load(text))) == sorted(all_keys())
    from ptdp_jax.run.loop import resolved_config
    from ptdp_jax.run.resolve import spelled_out         # ffn_hidden_size written out
    assert text == to_yaml(spelled_out(resolved_config()))


def test_at_most_66_user_keys_and_8_expert_ones():
    keys = all_keys()
    tuning = [k for k in keys if k.startswith("tuning.")]
    assert len(keys) - len(tuning) <= 66 and len(tuning) <= 8, (len(keys), len(tuning))
