"""Every constraint is checked before anything compiles; the error names the key and numbers."""
import pytest

from ptdp_jax.config.load import ConfigError, load_config, parse_cli_overrides
from ptdp_jax.config.validation import validate

OK = {"model.num_layers": 8, "model.hidden_size": 64, "model.num_heads": 8,
      "train.global_batch_size": 16, "train.micro_batch_size": 2}


def check(overrides, *fragments, devices=8):
    with pytest.raises(ConfigError) as e:
        validate(load_config(overrides={**OK, **overrides}), devices)
    msg = str(e.value)
    for f in fragments:
        assert f in msg, f"{f!r} not in {msg!r}"
    assert isinstance(e.value, ValueError)


def test_defaults_and_ok_config_validate():
    validate(load_config(), 1)
    validate(load_config(overrides=OK), 8)


@pytest.mark.parametrize("overrides,fragments", [
    ({"parallel.data": 4, "parallel.tensor": 4}, ["(4, 1, 4)", "16 devices", "only 8"]),
    ({"parallel.tensor": 8, "model.num_heads": 4, "model.hidden_size": 64},
     ["model.num_heads=4", "parallel.tensor=8"]),
    ({"parallel.tensor": 3, "model.num_heads": 6, "model.hidden_size": 48,
      "model.ffn_hidden_size": 96, "model.vocab_size": 100},
     ["padded vocabulary 128", "model.vocab_size=100", "parallel.tensor=3"]),
    ({"parallel.tensor": 4, "model.ffn_hidden_size": 90}, ["model.ffn_hidden_size=90", "parallel.tensor=4"]),
    ({"parallel.pipe": 3}, ["model.num_layers=8", "3 x 1 = 3"]),
    ({"parallel.pipe": 2, "parallel.schedule": "interleaved", "parallel.virtual_stages": 3},
     ["model.num_layers=8", "2 x 3 = 6"]),
    ({"train.global_batch_size": 10, "parallel.data": 2}, ["train.global_batch_size=10", "2 x 2 = 4"]),
    ({"parallel.pipe": 4, "parallel.schedule": "interleaved", "parallel.virtual_stages": 2,
      "train.global_batch_size": 12, "train.micro_batch_size": 2}, ["= 6", "parallel.pipe=4"]),
    ({"parallel.schedule": "interleaved", "parallel.virtual_stages": 1}, ["virtual_stages >= 2", "got 1"]),
    ({"parallel.virtual_stages": 2}, ["parallel.virtual_stages=2", "interleaved"]),
    ({"parallel.schedule": "zb-h1", "parallel.pipe": 2, "parallel.virtual_stages": 2},
     ["parallel.virtual_stages=2", "1f1b-phased, zb-phased", "'zb-h1'"]),
    ({"parallel.pipe": 4, "parallel.schedule": "zb-phased", "parallel.virtual_stages": 2,
      "train.global_batch_size": 12, "train.micro_batch_size": 2},
     ["zb-phased", "parallel.virtual_stages=2", "= 6", "parallel.pipe=4"]),
    # 1f1b-phased interleaved: microbatches in groups of p, and a pipeline to interleave
    ({"parallel.pipe": 4, "parallel.schedule": "1f1b-phased", "parallel.virtual_stages": 2,
      "train.global_batch_size": 12, "train.micro_batch_size": 2},
     ["1f1b-phased", "parallel.virtual_stages=2", "= 6", "parallel.pipe=4"]),
    ({"parallel.schedule": "1f1b-phased", "parallel.virtual_stages": 2},
     ["1f1b-phased", "parallel.pipe >= 2", "parallel.pipe=1"]),
    # p = 1 trained only the first chunk's layers (its gradient broadcast to the others)
    ({"parallel.schedule": "interleaved", "parallel.virtual_stages": 2},
     ["parallel.pipe >= 2", "parallel.pipe=1"]),
    ({"parallel.schedule": "zigzag"}, ["parallel.schedule='zigzag'", "gpipe"]),
    ({"model.arch": "bert"}, ["model.arch='bert'", "llama"]),
    ({"train.dtype": "float16"}, ["train.dtype", "bfloat16"]),
    ({"train.recompute": "some"}, ["train.recompute", "selective"]),
    ({"train.lr": 0.0}, ["train.lr", "got 0.0"]),
    ({"train.lr": -1e-3}, ["train.lr", "-0.001"]),
    ({"train.steps": 0}, ["train.steps", "got 0"]),
    ({"train.micro_batch_size": 0}, ["train.micro_batch_size", "got 0"]),
    ({"model.hidden_size": 60}, ["model.hidden_size=60", "model.num_heads=8"]),
    ({"model.dropout": 1.5}, ["model.dropout", "1.5"]),
    ({"model.rope_theta": 0.0}, ["model.rope_theta must be positive", "got 0.0"]),
    ({"model.norm_eps": -1e-5}, ["model.norm_eps must be positive"]),
    ({"train.seed": -1}, ["train.seed must be >= 0", "got -1"]),
    ({"data.path": ["/nonexistent/corpus"]}, ["data.path", "/nonexistent/corpus"]),
    ({"parallel.tensor": 8, "model.num_heads": 8, "model.hidden_size": 64,
      "parallel.scatter_gather": True, "model.ffn_hidden_size": 256}, []),
    ({"train.adam_betas": [0.9]}, ["train.adam_betas", "two numbers", "[0.9]"]),
    ({"train.adam_betas": [0.9, 1.5]}, ["train.adam_betas", "[0.9, 1.5]"]),
    ({"checkpoint.resume": "sometimes"}, ["checkpoint.resume='sometimes'", "overwrite"]),
    ({"train.dtype": "float16"}, ["train.dtype='float16'", "'auto'"]),
    ({"train.recompute": "some"}, ["train.recompute='some'", "'auto'"]),
    ({"tuning.attention": "flash"}, ["tuning.attention='flash'"]),
    ({"checkpoint.resume": "overwrite", "train.dtype": "auto", "train.recompute": "auto"}, []),
])
def test_rule_violations(overrides, fragments):
    if not fragments:      # a valid combination (scatter/gather with t | h): no error
        validate(load_config(overrides={**OK, **overrides}), 8)
        return
    check(overrides, *fragments)


def test_unknown_keys_and_bad_values():
    with pytest.raises(ConfigError, match="unknown config key 'model.hidden'"):
        load_config(overrides={"model.hidden": 3})
    with pytest.raises(ConfigError, match="unknown config key 'trian.steps'"):
        load_config(overrides={"trian.steps": 3})
    with pytest.raises(ConfigError, match="train.steps: cannot read 'many' as int"):
        load_config(overrides={"train.steps": "many"})
    with pytest.raises(ConfigError, match="train.steps: cannot read 2.5 as int"):
        load_config(overrides={"train.steps": 2.5})
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("configs/nope.yaml")
    with pytest.raises(ConfigError, match="key=value"):
        parse_cli_overrides(["train.steps"])


def test_yaml_and_dotted_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("model:\n  hidden_size: 96\n  num_heads: 6\ntrain:\n  lr: 1.0e-4\n")
    cfg = load_config(f, overrides=parse_cli_overrides(["train.lr=2e-4", "data.path=a,b",
                                                        "parallel.scatter_gather=true"]))
    assert cfg.model.hidden_size == 96 and cfg.train.lr == 2e-4
    assert cfg.data.path == ("a", "b") and cfg.parallel.scatter_gather is True
    with pytest.raises(Exception):
        cfg.train.lr = 1.0                      # frozen
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  hidden_sise: 96\n")
    with pytest.raises(ConfigError, match="model.hidden_sise"):
        load_config(bad)


def test_yaml_is_loaded_safely(tmp_path):
    f = tmp_path / "evil.yaml"
    f.write_text("train: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(Exception) as e:
        load_config(f)
    assert "pwned" not in str(e.value)


def test_microbatch_count_and_defaults():
    cfg = load_config(overrides={**OK, "parallel.data": 2})
    assert cfg.num_microbatches == 16 // (2 * 2)
    assert load_config(overrides={"model.arch": "llama", "model.hidden_size": 4096}).model.ffn == 11008
    assert load_config().model.ffn == 4 * load_config().model.hidden_size
    assert load_config(overrides={"model.vocab_size": 51200}).model.padded_vocab_size == 51200
    assert load_config(overrides={"model.vocab_size": 50257}).model.padded_vocab_size == 50304


def test_a_null_is_the_keys_default(tmp_path):
    """YAML null, in a file or a dotted override, unsets its key (the key's default, not the
    string 'None': no ./None/ checkpoint or run folder, no None.bin); it counts as not set."""
    from ptdp_jax.config.load import Config, ConfigWarning, load_with_keys
    f = tmp_path / "c.yaml"
    f.write_text("checkpoint: {dir: null, every: ~, resume: null}\nrun: {dir: null}\n"
                 "data: {path: null, weights: null}\nmodel: {vocab_size: null, arch: null}\n"
                 "train: {steps: null, fp8: null, adam_betas: null, beta1: null, max_bad_steps: "
                 "null}\nparallel: {stage_layers: null}\n")
    with pytest.warns(ConfigWarning, match="train.beta1 and train.beta2"):
        cfg, keys = load_with_keys(f)
    assert cfg == Config() and not keys
    ov = parse_cli_overrides(["checkpoint.dir=null", "run.dir=~", "data.path=null",
                              "train.steps=null"])
    cfg, keys = load_with_keys("configs/demo.yaml", {**ov, "checkpoint.dir": None})
    assert (cfg.checkpoint.dir, cfg.run.dir, cfg.data.path, cfg.train.steps) == \
        ("", "runs/latest", (), 200)
    assert not keys & set(ov) and "train.lr" in keys


@pytest.mark.parametrize("key,value,wanted", [
    ("run.dir", ["a", "b"], "a string"), ("run.dir", {"a": 1}, "a string"),
    ("checkpoint.dir", 2024, "a string"), ("data.path", [1], "a list of strings"),
    ("data.path", ["a", None], "a list of strings"), ("train.fp8", 2, "bool"),
    ("train.fp8", "1", "bool"), ("train.fp8", 0, "bool"), ("train.lr", float("inf"), "finite"),
    ("train.lr", float("nan"), "finite"), ("train.lr", "-inf", "finite"),
    ("train.lr", True, "finite"), ("train.steps", 2.0, "int"), ("train.steps", 2.5, "int"),
    ("train.steps", True, "int"), ("train.steps", "1e3", "int"), ("parallel.zero", 1.0, "int"),
    ("model.num_kv_heads", "None", "int"), ("train.adam_betas", 0.9, "a list of finite floats"),
    ("data.weights", [0.5, float("nan")], "finite"), ("tuning.static_stash", 1, "bool"),
    ("run.compile_cache", 0, "bool (true or false) or a string"),
])
def test_every_key_takes_exactly_its_type(key, value, wanted):
    """No loose coercion: a list is not a folder name, 2 is not true, 2.0 is not an int, inf
    is not a learning rate; the error names the key, the value and the type wanted."""
    with pytest.raises(ConfigError) as e:
        load_config(overrides={key: value})
    assert str(e.value).startswith(f"{key}: cannot read {value!r} as ") and wanted in str(e.value)


def test_values_of_their_type_and_their_text_load(tmp_path):
    cfg = load_config(overrides={"train.lr": "3e-4", "parallel.stage_layers": "2,1,1",
                                 "train.fp8": "false", "model.rope_theta": 500000,
                                 "data.weights": [1, 2], "train.adam_betas": (0.9, "9.5e-1"),
                                 "checkpoint.dir": tmp_path / "ckpt"})
    assert cfg.train.lr == 3e-4 and cfg.parallel.stage_layers == (2, 1, 1)
    assert cfg.train.fp8 is False and type(cfg.model.rope_theta) is float
    assert cfg.data.weights == (1.0, 2.0) and cfg.train.adam_betas == (0.9, 0.95)
    assert cfg.checkpoint.dir == str(tmp_path / "ckpt")
    f = tmp_path / "c.yaml"
    f.write_text("train:\n  lr: 1e-3\n  fp8: false\nrun:\n  dir:\n    a: 1\n")
    with pytest.raises(ConfigError, match=r"line 5: run.dir: cannot read \{'a': 1\} as a string"):
        load_config(f)
    with pytest.raises(ConfigError, match="train.lr: cannot read inf as a finite float"):
        load_config(overrides=parse_cli_overrides(["train.lr=.inf"]))
