"""Properties of the compiled programs: the parallel cross-entropy never gathers
full logits, and scatter/gather shrinks the stage-to-stage messages by t."""
import re

from compiled import compile_grad_fn
from parity import tiny_config


def _shapes(hlo: str) -> set[str]:
    return set(re.findall(r"\[([0-9,]+)\]", hlo))


def test_cross_entropy_keeps_logits_vocab_sharded():
    t = 8
    cfg = tiny_config("gpt", (1, 1, t))
    hlo = compile_grad_fn(cfg).as_text()
    b, s, vp = cfg.train.micro_batch_size, cfg.model.seq_len, cfg.model.padded_vocab_size
    shapes = _shapes(hlo)
    assert f"{b},{s},{vp // t}" in shapes, "expected per-device logits of 1/t of the vocabulary"
    assert f"{b},{s},{vp}" not in shapes, "full (b, s, V) logits appear on one device"


def _permute_payloads(hlo: str) -> list[int]:
    sizes = []
    for line in hlo.splitlines():
        if re.search(r"collective-permute(-start)?\(", line):
            dims = re.search(r"=\s*\(?\w+\[([0-9,]*)\]", line).group(1)
            n = 1
            for d in dims.split(","):
                n *= int(d)
            sizes.append(n)
    return sizes


def test_scatter_gather_shrinks_permute_payload_by_t():
    t = 4
    plain = _permute_payloads(compile_grad_fn(tiny_config("gpt", (1, 2, t))).as_text())
    sg = _permute_payloads(compile_grad_fn(
        tiny_config("gpt", (1, 2, t), **{"parallel.scatter_gather": True})).as_text())
    assert plain and sg and len(plain) == len(sg)
    assert max(sg) * t == max(plain), (plain, sg)


def _while_bodies(hlo: str) -> dict[str, str]:
    """Computation name -> text, for the bodies of while loops (the microbatch / tick loops)."""
    names = set(re.findall(r"body=%?([\w.\-]+)", hlo))
    blocks, current, lines = {}, None, []
    for line in hlo.splitlines():
        m = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
        if m:
            current, lines = m.group(1), []
        elif line.startswith("}") and current:
            blocks[current] = "\n".join(lines)
            current = None
        elif current:
            lines.append(line)
    return {n: blocks[n] for n in names if n in blocks}


def test_data_parallel_gradients_are_reduced_once_per_step():
    """No all-reduce inside the microbatch loop: each replica accumulates locally and
    the gradients are all-reduced once, after the loop (pure data parallel, and data x pipe)."""
    for mesh, extra in (((2, 1, 1), {}), ((2, 2, 1), {})):
        cfg = tiny_config("gpt", mesh, **extra)
        assert cfg.num_microbatches > 1
        hlo = compile_grad_fn(cfg).as_text()
        bodies = _while_bodies(hlo)
        assert bodies, "expected a loop over microbatches or ticks"
        for name, body in bodies.items():
            assert "all-reduce" not in body, f"all-reduce inside loop body {name}"
        assert "all-reduce" in hlo


def test_unrolled_layer_gradients_are_not_summed_from_padded_slices():
    """Unrolled layers (p = 1): each layer's gradient is added into its slot of the float32
    stack in place, not built as the sum of L zero-padded copies (the transpose of L slices of
    the stack: one fusion of L pads, ~3x the bandwidth-bound time on GPUs). One device, ZeRO-2
    (per-layer reduce-scatters) and ZeRO-1 (full-size sums), each with m > 1."""
    for mesh, extra in (((1, 1, 1), {}), ((4, 1, 1), {"parallel.zero": 2}),
                        ((4, 1, 1), {"parallel.zero": 1})):
        cfg = tiny_config("gpt", mesh, **{"tuning.scan_layers": False, **extra})
        assert cfg.num_microbatches > 1 and not cfg.scan_layers_on
        hlo = compile_grad_fn(cfg).as_text()
        L = cfg.model.num_layers
        # a pad into the stack at layer i > 0 (low padding i on the layer dim); layer 0 into
        # zeros (0_{L-1}) is only how a zero-initialised sum's first add is written
        pads = re.findall(rf"= \w+\[{L},[0-9,]*\]\S* pad\(.*padding=([1-9][0-9]*)_", hlo)
        assert not pads, f"{mesh} {extra}: layer stack built from pads at layers {pads}"
