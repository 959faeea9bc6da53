"""Tests of the numpy data pipeline (tokenizers, prepare, token datasets, blended stream)."""

import json
import re

import numpy as np
import pytest

from ptdp_jax.data import (
    BlendedStream,
    BPETokenizer,
    ByteTokenizer,
    TokenDataset,
    batch_for_step,
    blending_indices,
    data_state,
    default_corpus_documents,
    load_tokenizer,
    open_datasets,
    prepare_dataset,
    prepare_default_corpus,
    validate_data_config,
)
from ptdp_jax.data.prepare import main

DOCS = [
    "The quick brown fox jumps over the lazy dog.",
    "Pipeline parallelism splits layers; tensor parallelism splits matrices. ünïcödé ✓",
    "Data parallel replicas each read a slice of the global batch.",
    "日本語のテキストも大丈夫です。 emoji: 🚀🚀",
]


def _write_corpus(tmp_path, n_docs=40):
    """A .txt and a .jsonl input with known documents."""
    txt = tmp_path / "a.txt"
    txt.write_text(DOCS[1] * 3, encoding="utf-8")
    jsonl = tmp_path / "b.jsonl"
    docs = [f"{DOCS[i % 4]} #{i}" for i in range(n_docs)]
    lines = [json.dumps({"text": d, "id": i}) for i, d in enumerate(docs)]
    jsonl.write_text("\n".join(lines) + "\n\n", encoding="utf-8")
    return txt, jsonl, [DOCS[1] * 3] + docs


def _ramp_dataset(tmp_path, name, num_tokens):
    """A dataset whose token i is i % 251 -- window contents are easy to predict."""
    prefix = tmp_path / name
    ids = (np.arange(num_tokens) % 251).astype(np.uint16)
    ids.tofile(f"{prefix}.bin")
    np.save(f"{prefix}.idx.npy", np.array([0, num_tokens], dtype=np.int64))
    meta = {"format": "ptdp_jax.tokens", "version": 1, "dtype": "uint16", "num_tokens": num_tokens,
            "num_docs": 1, "vocab_size": 257, "eos_id": 256, "tokenizer": "byte", "sources": []}
    (tmp_path / f"{name}.json").write_text(json.dumps(meta))
    return TokenDataset(prefix)


def test_byte_tokenizer_round_trip():
    tok = ByteTokenizer()
    for text in DOCS + [""]:
        ids = tok.encode(text)
        assert all(0 <= i < 256 for i in ids)
        assert tok.decode(ids + [tok.eos_id]) == text
    assert (tok.vocab_size, tok.eos_id) == (257, 256)
    assert isinstance(load_tokenizer(tok.spec), ByteTokenizer)
    assert tok.decode([0xE6]) == "\ufffd"  # truncated UTF-8 is replaced, not an error


def test_bpe_train_save_load(tmp_path):
    tok = BPETokenizer.train(DOCS * 5, vocab_size=300)
    assert tok.vocab_size <= 300 and tok.eos_id is not None
    path = tok.save(tmp_path / "tok.json")
    loaded = load_tokenizer(tok.spec)
    assert isinstance(loaded, BPETokenizer) and loaded.spec == str(path)
    for text in DOCS:
        ids = loaded.encode(text)
        assert ids == tok.encode(text)
        assert len(ids) < len(text.encode("utf-8")) or len(text) < 10
        assert loaded.decode(ids + [loaded.eos_id]) == text
    with pytest.raises(ValueError):
        load_tokenizer("bpe")


def test_prepare_txt_and_jsonl(tmp_path):
    txt, jsonl, docs = _write_corpus(tmp_path)
    prefix = prepare_dataset([str(txt), str(jsonl)], tmp_path / "out" / "ds")
    ds = TokenDataset(prefix)
    tok = ByteTokenizer()
    expected = np.concatenate([tok.encode(d) + [tok.eos_id] for d in docs])
    assert isinstance(ds.tokens, np.memmap)
    assert ds.num_docs == len(docs) and ds.num_tokens == len(expected)
    assert (ds.vocab_size, ds.eos_id, ds.tokenizer_spec, ds.dtype) == (257, 256, "byte", np.uint16)
    np.testing.assert_array_equal(ds.tokens, expected)
    offsets = ds.doc_offsets
    assert offsets[0] == 0 and offsets[-1] == ds.num_tokens
    assert tok.decode(ds.tokens[offsets[5]:offsets[6]]) == docs[5]
    assert not list((tmp_path / "out").glob("*tmp*"))  # temporary files are gone


def test_prepare_bpe(tmp_path):
    txt, jsonl, docs = _write_corpus(tmp_path)
    prefix = prepare_dataset([txt, jsonl], tmp_path / "bpe", tokenizer="bpe", bpe_vocab_size=320)
    ds = TokenDataset(prefix)
    tok = load_tokenizer(ds.tokenizer_spec)
    assert ds.tokenizer_spec == str((tmp_path / "bpe.tokenizer.json").resolve())
    expected = np.concatenate([tok.encode(d) + [tok.eos_id] for d in docs])
    np.testing.assert_array_equal(ds.tokens, expected)
    assert ds.vocab_size == tok.vocab_size and ds.eos_id == tok.eos_id
    # an existing tokenizer.json can be reused by path
    again = TokenDataset(prepare_dataset([txt], tmp_path / "again", tokenizer=ds.tokenizer_spec))
    assert again.tokenizer_spec == ds.tokenizer_spec


def test_windows_and_split(tmp_path):
    ds = _ramp_dataset(tmp_path, "ramp", 1000)
    s = 10
    assert ds.num_windows(s) == 99
    n_train, n_val = ds.split_sizes(s)
    assert (n_train, n_val) == (95, 4)
    w = ds.read_windows(np.array([0, 7, 98]), s)
    assert w.dtype == np.int32 and w.shape == (3, s + 1)
    np.testing.assert_array_equal(w[1], (np.arange(70, 81) % 251))
    train = BlendedStream([ds], None, s, seed=1, split="train")
    val = BlendedStream([ds], None, s, seed=1, split="val")
    _, tw = train.locate(np.arange(n_train))
    _, vw = val.locate(np.arange(n_val))
    assert sorted(tw) == list(range(n_train)) and sorted(vw) == list(range(n_train, 99))
    np.testing.assert_array_equal(val.get([0])[0], ds.read_windows(vw[:1], s)[0])
    small = _ramp_dataset(tmp_path, "small", 2 * s)  # (20 - 1) // 10 = 1 window
    with pytest.raises(ValueError, match="small.*20 tokens.*seq_len 10"):
        small.split_sizes(s)


def test_val_path_is_a_validation_set_of_its_own(tmp_path):
    """With data.val_path the validation stream reads every window of that set and nothing of
    data.path, whose windows all go to training (none held out); a set of one window will do
    for either. A validation set of another tokenizer, or a missing one, is refused naming
    data.val_path[0]."""
    from ptdp_jax.config.load import ConfigError, load_config
    from ptdp_jax.run.feed import open_streams
    s = 10
    train_ds = _ramp_dataset(tmp_path, "train", 1000)
    val_ds = _ramp_dataset(tmp_path, "val", 301)
    one = _ramp_dataset(tmp_path, "one", s + 1)
    given = {"data.path": str(train_ds.prefix), "model.seq_len": s}
    _, train, val = open_streams(load_config(None, given))
    assert train.num_samples.tolist() == [95] and val.num_samples.tolist() == [4]
    _, train, val = open_streams(load_config(None, {**given, "data.val_path": str(val_ds.prefix)}))
    assert train.num_samples.tolist() == [99]
    assert [d.prefix for d in val.datasets] == [val_ds.prefix]
    _, tw = train.locate(np.arange(99))
    k, vw = val.locate(np.arange(30))
    assert sorted(tw) == list(range(99)) and sorted(vw) == list(range(30)) and not k.any()
    np.testing.assert_array_equal(val.get([0])[0], val_ds.read_windows(vw[:1], s)[0])
    _, train, val = open_streams(load_config(None, {"data.path": str(one.prefix),
                                                    "data.val_path": str(one.prefix),
                                                    "model.seq_len": s}))
    assert train.num_samples.tolist() == val.num_samples.tolist() == [1]
    (tmp_path / "b.txt").write_text("other text, other tokens " * 50)
    bpe = prepare_dataset([tmp_path / "b.txt"], tmp_path / "bpe", tokenizer="bpe",
                          bpe_vocab_size=257)
    with pytest.raises(ConfigError, match=r"data.val_path\[0\] = .*bpe' was made with another "
                                          r"tokenizer .* than the training data"):
        open_streams(load_config(None, {**given, "data.val_path": str(bpe)}))
    with pytest.raises(ConfigError, match=r"data.val_path\[1\] = .*nothere.*not found"):
        open_streams(load_config(None, {**given, "data.val_path": f"{val_ds.prefix},"
                                                                  f"{tmp_path / 'nothere'}"}))


def test_blended_proportions_exact_in_prefixes(tmp_path):
    dss = [_ramp_dataset(tmp_path, f"d{i}", 3000 + 100 * i) for i in range(3)]
    weights = [0.67, 0.15, 0.18]
    stream = BlendedStream(dss, weights, 8, seed=0)
    k, _ = stream.locate(np.arange(1000))
    counts = np.stack([np.cumsum(k == i) for i in range(3)], axis=1)
    target = np.arange(1, 1001)[:, None] * np.array(weights)
    assert np.abs(counts - target).max() < 1.0
    # irrational-looking weights still hold (quantized period)
    di, _ = blending_indices([30013, 25969, 9554])
    c = np.stack([np.cumsum(di == i) for i in range(3)], axis=1)
    w = np.array([30013, 25969, 9554]) / 65536
    assert np.abs(c - np.arange(1, 65537)[:, None] * w).max() < 1.0


def test_determinism_rows_and_order_independence(tmp_path):
    dss = [_ramp_dataset(tmp_path, f"d{i}", 2000 + 500 * i) for i in range(2)]
    mk = lambda seed: BlendedStream(dss, [0.3, 0.7], 16, seed=seed)
    a, b, c = mk(5), mk(5), mk(6)
    for step in (0, 3, 41):
        np.testing.assert_array_equal(batch_for_step(a, step, 8), batch_for_step(b, step, 8))
    assert not np.array_equal(batch_for_step(a, 0, 8), batch_for_step(c, 0, 8))
    full = batch_for_step(a, 7, 8)
    for lo, hi in ((0, 4), (4, 8), (2, 3)):
        np.testing.assert_array_equal(batch_for_step(b, 7, 8, rows=slice(lo, hi)), full[lo:hi])
    fresh = mk(5)  # step 7 first, without reading steps 0..6 (e.g. after resuming)
    np.testing.assert_array_equal(batch_for_step(fresh, 7, 8), full)
    assert data_state(7, 8) == {"step": 7, "global_batch_size": 8, "consumed_samples": 56}
    # each sample is a real window with next-token structure
    assert np.all((full[:, 1:] - full[:, :-1]) % 251 == 1)


def test_epoch_wrap_around(tmp_path):
    ds = _ramp_dataset(tmp_path, "tiny", 101)  # 10 windows of seq_len 10 -> 9 train
    stream = BlendedStream([ds], [1.0], 10, seed=3)
    n = stream.num_samples[0]
    _, w = stream.locate(np.arange(3 * n))
    epochs = w.reshape(3, n)
    for e in epochs:
        assert sorted(e) == list(range(n))
    assert not np.array_equal(epochs[0], epochs[1])
    big = stream.get(np.arange(5 * n))
    assert big.shape == (5 * n, 11)


def test_default_corpus(tmp_path):
    docs = default_corpus_documents()
    assert len(docs) > 50 and docs == default_corpus_documents()
    prefix = prepare_default_corpus(tmp_path)
    ds = TokenDataset(prefix)
    assert ds.num_tokens > 100_000 and ds.num_docs == len(docs)
    mtime = (tmp_path / f"{prefix.name}.bin").stat().st_mtime_ns
    assert prepare_default_corpus(tmp_path) == prefix  # reused, not rebuilt
    assert (tmp_path / f"{prefix.name}.bin").stat().st_mtime_ns == mtime
    [opened] = open_datasets([], tmp_path)
    assert opened.num_tokens == ds.num_tokens


def test_errors(tmp_path):
    txt, jsonl, _ = _write_corpus(tmp_path)
    missing = tmp_path / "nope.txt"
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        prepare_dataset([txt, missing], tmp_path / "x")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": broken\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        prepare_dataset([bad], tmp_path / "x")
    bad.write_text('{"text": "ok"}\n\n{"body": "x"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:3.*'text'"):
        prepare_dataset([bad], tmp_path / "x")
    with pytest.raises(FileNotFoundError, match=r"data.path\[0\].*nothere"):
        validate_data_config([str(tmp_path / "nothere")], None, 8)
    prefix = str(prepare_dataset([txt, jsonl], tmp_path / "ok"))
    assert validate_data_config([prefix, prefix], [1, 3], 8) == [0.25, 0.75]
    with pytest.raises(ValueError, match="data.weights has 1 entries but data.path has 2"):
        validate_data_config([prefix, prefix], [1.0], 8)
    with pytest.raises(ValueError, match=r"data.weights\[1\]"):
        validate_data_config([prefix, prefix], [1.0, -1.0], 8)
    with pytest.raises(ValueError, match="all zero"):
        validate_data_config([prefix], [0.0], 8)
    with pytest.raises(ValueError, match=r"data.path\[0\].*tokens.*seq_len 100000"):
        validate_data_config([prefix], None, 100_000)
    with open(f"{prefix}.bin", "ab") as f:  # size no longer matches the metadata
        f.write(b"\0\0")
    with pytest.raises(ValueError, match="ok.bin"):
        TokenDataset(prefix)


def test_cli(tmp_path, capsys):
    txt, jsonl, docs = _write_corpus(tmp_path)
    out = tmp_path / "cli" / "corpus"
    assert main([str(txt), str(jsonl), "--out", str(out)]) == 0
    line = capsys.readouterr().out.strip()
    assert f"{len(docs)} documents" in line and "corpus.bin" in line and "\n" not in line
    assert TokenDataset(out).num_docs == len(docs)
    argv = [str(jsonl), "--out", f"{out}_bpe", "--tokenizer", "bpe", "--vocab-size", "300"]
    assert main(argv) == 0
    assert "tokenizer.json" in capsys.readouterr().out
    assert main([*argv[:-1], "100000", "--out", f"{out}_big"]) == 0    # more than the text holds
    vocab = TokenDataset(f"{out}_big").vocab_size
    assert f"the BPE stopped at {vocab} of the 100000 ids" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([str(tmp_path / "missing.jsonl"), "--out", str(out)])
    assert "missing.jsonl" in capsys.readouterr().err


def test_cli_reads_text_files_by_extension(tmp_path, capsys):
    """--ext .py,md: each file of those extensions is one document, like a .txt, given alone
    ('1 document') or found in a folder at any depth (hidden folders, other extensions and
    .txt files there skipped); without --ext a .py is refused naming --ext; a file that is
    not UTF-8, or a structured format as an --ext, is one line (exit 2)."""
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / ".git").mkdir()
    (src / "a.py").write_text("def f():\n    return 1\n")
    (src / "pkg" / "b.md").write_text("# Title\n\nText.\n")
    (src / "pkg" / "c.txt").write_text("not an --ext")
    (src / ".git" / "d.py").write_text("hidden")
    (src / "e.bin").write_bytes(b"\0\1")
    assert main([str(src), "--out", str(tmp_path / "code"), "--ext", ".py,md"]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("prepared 2 documents, ") and out.err == ""
    tok = ByteTokenizer()
    want = [tok.encode((src / n).read_text()) + [256] for n in ("a.py", "pkg/b.md")]
    np.testing.assert_array_equal(TokenDataset(tmp_path / "code").tokens, np.concatenate(want))
    assert main([str(src / "a.py"), "--out", str(tmp_path / "one"), "--ext", "py"]) == 0
    assert capsys.readouterr().out.startswith("prepared 1 document, ")
    (tmp_path / "bad.py").write_bytes(b"ok \xff\xfe")
    for argv, words in (([str(src / "a.py")], "unsupported input type '.py'"),
                        ([str(src / "a.py")], "--ext .py reads such files as plain text"),
                        ([str(tmp_path / "bad.py"), "--ext", ".py"],
                         "bad.py: not UTF-8 text (byte offset 3: 0xff)"),
                        ([str(src / "a.py"), "--ext", ".py,.jsonl"], "'.jsonl' is not an "
                                                                      "extension of plain-text")):
        with pytest.raises(SystemExit) as e:
            main(argv + ["--out", str(tmp_path / "x")])
        err = capsys.readouterr().err
        assert e.value.code == 2 and words in err and err.count("\n") == 1, err
    assert not list(tmp_path.glob("x.*"))


def test_cli_progress_only_on_large_input(tmp_path, capsys, monkeypatch):
    """A small input, stderr not a terminal: nothing on stderr (a log stays clean); an input
    of LARGE_INPUT_BYTES or more: a progress bar over its bytes on stderr for each pass over
    the text (the BPE's training and the tokenizing), each reaching 100%."""
    from ptdp_jax.data import prepare
    txt = tmp_path / "a.txt"
    txt.write_text("some words, more words " * 200)
    assert main([str(txt), "--out", str(tmp_path / "small")]) == 0
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(prepare, "LARGE_INPUT_BYTES", 1000)
    assert main([str(txt), "--out", str(tmp_path / "big"), "--tokenizer", "bpe",
                 "--vocab-size", "270"]) == 0
    err = capsys.readouterr().err
    assert "training the BPE: 100%" in err and "tokenizing: 100%" in err, err
    assert err.count("4.60k/4.60k") >= 2, err


@pytest.mark.parametrize("name,data,where", [
    ("latin1.txt", "caf\xe9 au lait".encode("latin-1"), "(byte offset 3: 0xe9)"),
    ("latin1.jsonl", b'{"text": "ok"}\n\n{"text": "caf\xe9"}\n', "(line 3, byte offset 29: 0xe9)"),
], ids=["txt", "jsonl"])
def test_a_file_that_is_not_utf8_is_named(tmp_path, capsys, name, data, where):
    """A .txt or .jsonl file that is not UTF-8: one line naming the file and the byte offset
    of the first byte that is not (it said only "'utf-8' codec can't decode byte 0xe9")."""
    (tmp_path / name).write_bytes(data)
    (tmp_path / "good.txt").write_text("caf\u00e9\r\nau lait", encoding="utf-8")
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "good.txt"), str(tmp_path / name), "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{tmp_path / name}: not UTF-8 text {where}" in err, err
    prefix = prepare_dataset([tmp_path / "good.txt"], tmp_path / "good")     # CRLF read as LF
    assert ByteTokenizer().decode(TokenDataset(prefix).tokens[:-1]) == "caf\u00e9\nau lait"


@pytest.mark.parametrize("out", ["bad/", ".", "..", "folder", "folder/.", ""])
def test_cli_refuses_a_folder_as_out(tmp_path, capsys, monkeypatch, out):
    """--out is a file prefix: a folder, a path ending in '/', '.' or '..' is refused with one
    line and exit 2 before anything is written (it wrote bad.bin beside bad/, or ..bin)."""
    txt, _, _ = _write_corpus(tmp_path)
    (tmp_path / "folder").mkdir()
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(SystemExit) as e:
        main([str(txt), "--out", out])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1
    assert f"--out {out!r} is " in err and "file prefix" in err
    assert sorted(tmp_path.rglob("*")) == before
    with pytest.raises(ValueError, match="file prefix"):
        prepare_dataset([txt], tmp_path / "folder")


def test_prepare_parquet_and_arrow(tmp_path, capsys, monkeypatch):
    """Parquet and Arrow files (a folder as Dataset.save_to_disk leaves it: an IPC stream and
    JSON beside it) give one document a row of --text-key's column, null rows skipped; a
    missing column names the ones there; without pyarrow the error names the package."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    docs = [f"{DOCS[i % 4]} #{i}" for i in range(9)]
    table = pa.table({"id": list(range(6)), "content": docs[:5] + [None]})
    pq.write_table(table, tmp_path / "a.parquet")
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "dataset_info.json").write_text("{}")
    with pa.OSFile(str(saved / "data-00000-of-00001.arrow"), "wb") as f:
        part = pa.table({"content": docs[5:], "id": list(range(4))})
        with pa.ipc.new_stream(f, part.schema) as w:
            w.write_table(part)
    with pa.OSFile(str(tmp_path / "b.arrow"), "wb") as f:        # the IPC file format too
        with pa.ipc.new_file(f, part.schema) as w:
            w.write_table(part)
    out = tmp_path / "ds"
    assert main([str(tmp_path / "a.parquet"), str(saved), str(tmp_path / "b.arrow"),
                 "--out", str(out), "--text-key", "content"]) == 0
    assert "13 documents" in capsys.readouterr().out
    ds, tok = TokenDataset(out), ByteTokenizer()
    want = docs + docs[5:]
    np.testing.assert_array_equal(ds.tokens, np.concatenate([tok.encode(d) + [256] for d in want]))
    with pytest.raises(SystemExit):
        main([str(tmp_path / "a.parquet"), "--out", str(tmp_path / "x")])
    assert "no column 'text' (columns: id, content); name the text column with --text-key" \
        in capsys.readouterr().err
    monkeypatch.setitem(__import__("sys").modules, "pyarrow", None)
    with pytest.raises(ValueError, match="needs the pyarrow package: pip install pyarrow"):
        prepare_dataset([tmp_path / "a.parquet"], tmp_path / "y", text_key="content")


def test_tokenizer_folder(tmp_path, capsys):
    """--tokenizer DIR reads DIR/tokenizer.json; its end of document is <|endoftext|>, else
    the eos_token of DIR/tokenizer_config.json (LLaMA's </s>); the spec kept is the file's."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    gpt = tmp_path / "gpt"
    BPETokenizer.train(DOCS * 5, vocab_size=300).save(gpt / "tokenizer.json")
    llama = tmp_path / "llama"
    llama.mkdir()
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.train_from_iterator(DOCS * 5, trainers.BpeTrainer(
        vocab_size=290, special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    t.save(str(llama / "tokenizer.json"))
    (llama / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": {"content": "</s>", "special": True}}))
    (tmp_path / "a.txt").write_text(DOCS[0])
    for folder, eos in ((gpt, "<|endoftext|>"), (llama, "</s>")):
        tok = load_tokenizer(folder)
        assert tok.eos_token == eos and tok.eos_id == tok._tok.token_to_id(eos)
        assert main([str(tmp_path / "a.txt"), "--out", str(tmp_path / f"{folder.name}-data"),
                     "--tokenizer", str(folder)]) == 0
        ds = TokenDataset(tmp_path / f"{folder.name}-data")
        assert ds.tokenizer_spec == str(folder / "tokenizer.json") and ds.eos_id == tok.eos_id
        assert load_tokenizer(ds.tokenizer_spec).eos_id == tok.eos_id
    capsys.readouterr()
    with pytest.raises(ValueError, match="holds no tokenizer.json"):
        load_tokenizer(tmp_path)
    (llama / "tokenizer_config.json").unlink()
    with pytest.raises(ValueError, match=re.escape("has no '<|endoftext|>' special token")):
        load_tokenizer(llama)
