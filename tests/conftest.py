import os

# 8 fake CPU devices for the mesh tests; must be set before jax is imported (subprocesses
# that tests start inherit it).
# --xla_backend_optimization_level=0: XLA's CPU compiles of the tiny test models take
# about a third of the time (every comparison in the tests is between runs with the same flags).
# The collective timeouts: when a collective's participants do not all arrive, XLA:CPU aborts
# the process ("Fatal Python error: Aborted", seen in CI; reproduced by a terminate timeout of
# 0). The CI hangs were deadlocks, not slowness (a hung worker: no CPU used, its device threads
# parked in two different collectives); the pipeline now orders its collectives on CPU
# (pipeline/routing.py). A deadlock left anywhere fails after 60 s, and the make targets run a
# crashed worker's test once more.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 "
                                   "--xla_backend_optimization_level=0 "
                                   "--xla_cpu_collective_call_warn_stuck_timeout_seconds=20 "
                                   "--xla_cpu_collective_call_terminate_timeout_seconds=60")

import pytest  # noqa: E402


@pytest.fixture(scope="module")
def data_cache(tmp_path_factory):
    """A per-module cache for the embedded corpus's token file ($PTDP_CACHE_DIR, which the
    processes a test starts inherit)."""
    path = tmp_path_factory.mktemp("data_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PTDP_CACHE_DIR", str(path))
        yield path


@pytest.fixture(autouse=True)
def _no_progress_bar(monkeypatch):
    """Runs in a test log lines, as in a log file, even under `pytest -s` on a terminal."""
    from ptdp_jax.config import decisions as decisions
    monkeypatch.setattr(decisions, "progress_bar", lambda stream=None: False)


# `make test` (pytest -m "not slow") is the quick check (11 min 15 s on 2 cores): every test
# but those below, which are marked `slow` and run with the rest in `make test-all` (CI).
# A key is a test function; its value names the parametrized cases that stay quick (empty:
# all of them are slow). What stays quick touches every feature at least once: each parallel
# axis and schedule, ZeRO 1-3, sequence parallelism, tensor overlap, checkpoint and resume,
# faults, two processes, data, export, plan, the CLI and its errors. What moves is the
# repetition: the same paths on more meshes, models and options, and the slowest HLO and
# memory checks (each above about 5 s on 2 quiet cores).
SLOW = {
    "test_attention.py::test_cudnn_route_backward_does_not_run_the_forward_again": (),
    "test_attention.py::test_cudnn_route_parity": (),
    "test_packed.py::test_packed_document_mask_parity": ("one",),
    "test_bench_tools.py::test_bench_train_reports_the_layout_that_ran": (),
    "test_checkpoint.py::test_different_model_is_one_clear_error": (),
    "test_checkpoint.py::test_fresh_run_keeps_old_checkpoints_unless_told": (),
    "test_checkpoint.py::test_reshard_across_layouts": (),
    "test_checkpoint.py::test_resume_is_bit_identical": (),
    "test_checkpoint.py::test_run_resumes_from_a_version_1_checkpoint": (),
    "test_compile_cache.py::test_a_second_run_compiles_nothing_new": (),
    "test_context.py::test_context_parity": ("c2", "t2-sp-gqa", "c4-zero3"),
    "test_context.py::test_context_parity_fp8": ("c2",),
    "test_context.py::test_split_attention_over_devices_is_attention": ("4-True",),
    "test_decode.py::test_cached_logits_are_the_full_forwards": ("llama",),
    "test_documents.py::test_document_mask_parity": ("c2", "p2-t2"),
    "test_offload.py::test_offload_parity": ("one-device", "zero3-scan"),
    "test_offload.py::test_offload_pipeline_parity": ("interleaved-indexed", "tensor2-sp"),
    "test_offload.py::test_offload_pipeline_parity_fp8": (),
    "test_decode.py::test_greedy_tokens_with_and_without_the_cache": ("gpt",),
    "test_export.py::test_export_matches_transformers": ("llama",),
    "test_faults.py::test_disk_full_during_save": (),
    "test_faults.py::test_nonfinite_steps_are_skipped": (),
    "test_fp8.py::test_fp8_changes_the_numbers": (),
    "test_fp8.py::test_fp8_parity": ("2x2x2-sp-llama",),
    "test_fp8.py::test_fp8_ring_parity_under_recomputation": (),
    "test_fp8.py::test_fp8_resume_is_bit_identical": (),
    "test_fp8.py::test_weights_are_rounded_once_a_step": ("zero2",),
    "test_fp8_delayed.py::test_delayed_parity": ("data2-llama", "tensor2-sp-llama"),
    "test_fp8_delayed.py::test_delayed_resume_is_bit_identical": (),
    "test_fp8_delayed.py::test_the_steady_step_is_the_same_step": (),
    "test_fp8_delayed.py::test_a_history_of_the_steps_own_scales_is_current_scaling": (),
    "test_fused_loss.py::test_fused_head_keeps_no_logits_for_the_backward": (),
    "test_fused_loss.py::test_fused_head_loss_equals_plain": (),
    "test_hlo.py::test_cross_entropy_keeps_logits_vocab_sharded": (),
    "test_hlo.py::test_data_parallel_gradients_are_reduced_once_per_step": (),
    "test_hlo.py::test_scatter_gather_shrinks_permute_payload_by_t": (),
    "test_hlo.py::test_unrolled_layer_gradients_are_not_summed_from_padded_slices": (),
    "test_keep_ffn_activation.py::test_parity": (),
    "test_keep_ffn_activation.py::test_parity_without_it": (),
    "test_lr_schedule.py::test_resumed_wsd_run_keeps_the_schedule": (),
    "test_memory.py::test_1f1b_memory_is_bounded_and_gpipe_grows": (),
    "test_multihost.py::test_a_signal_to_one_process_stops_both_at_one_step": (),
    "test_multihost.py::test_checkpoints_cross_process_counts": (),
    "test_multihost.py::test_killed_process_stops_the_other_then_restart_resumes": (),
    "test_multihost.py::test_two_processes_match_one": ("2x1x4",),
    "test_parity_dp_tp.py::test_data_tensor_parity": ("2x1x4-gpt",),
    "test_parity_dp_tp.py::test_gqa_data_tensor_parity": (),
    "test_parity_pipeline.py::test_pipeline_parity": (
        "gpt-1x4x1-gpipe-mb2-full",
        "llama-2x4x1-zb-h1-mb1-selective-static",
        "llama-1x4x2-zb-v-v2-mb2-selective",
        "gpt-2x2x2-1f1b-phased-v2-mb2-sg",
        "gpt-1x4x1-zb-phased-mb4",
    ),
    "test_phased.py::test_head_runs_in_the_tick_loop_without_a_conditional": (),
    "test_phased.py::test_interleaved_runs_three_loops_with_the_head_in_a_conditional": (),
    "test_plan.py::test_162b_on_64_gpus_recommends_t8_p8_tensor_first_then_pipeline": (),
    "test_plan.py::test_choose_layout_is_valid_and_explicit_keys_win": (),
    "test_memory_estimate.py::test_estimate_against_the_compiled_train_and_eval_steps": (
        "one", "zb-phased"),
    "test_run_control.py::test_ctrl_c_without_a_checkpoint_dir_stops_cleanly": (),
    "test_run_control.py::test_the_loop_reads_a_step_while_the_next_runs": (),
    "test_run_control.py::test_evaluation_is_the_forward_loss_without_dropout": ("1x2x2-zb-v",),
    "test_run_control.py::test_extend_a_finished_run_keeps_its_schedule": (),
    "test_run_control.py::test_metrics_shared_by_runs_and_resumes": (),
    "test_run_control.py::test_resuming_past_train_steps_says_nothing_to_train": (),
    "test_run_control.py::test_validation_loss_logged_without_a_bar_and_kept_on_it": (),
    "test_run_faults.py::test_out_of_memory_is_one_line_per_phase": ("train-3-2",),
    "test_scan_layers.py::test_unrolled_layers_equal_scanned": ("tiny-llama-full",),
    "test_sequence_parallel.py::test_activation_memory_drops_at_1x1x8": ("llama-selective",),
    "test_sequence_parallel.py::test_layer_all_reduces_become_reduce_scatter_and_all_gather": (
        "llama",
    ),
    "test_sequence_parallel.py::test_sequence_parallel_parity": ("llama-1x2x4-1f1b-full",),
    "test_sequence_parallel.py::test_stage_message_is_split_without_scatter_gather": (),
    "test_static_stash.py::test_static_stash_indexes_no_residual": (),
    "test_static_stash.py::test_static_stash_needs_less_memory": (),
    "test_static_stash.py::test_static_w_stash_indexes_nothing": (),
    "test_tp_overlap.py::test_direct_sends_no_chain": (),
    "test_tp_overlap.py::test_parity": ("llama-1x1x4-mb4-none",),
    "test_train.py::test_dropout_is_layout_independent": (),
    "test_train.py::test_layouts_reproduce_single_device_run": ("2x1x4-sequence-parallel",),
    "test_uninitialised.py::test_buffers_written_before_read": ("interleaved-v2-121",),
    "test_uninitialised.py::test_gpu_lowering_allocates_without_filling": (),
    "test_uninitialised.py::test_nan_in_a_sum_would_show": (),
    "test_uninitialised.py::test_overlap_p2p_changes_no_bit": (),
    "test_uninitialised.py::test_overlap_p2p_keeps_the_forward_message_out_of_the_backward_switch": (
        "False",
    ),
    "test_user_errors.py::test_bfloat16_pipeline_with_tensor_dry_runs": ("2,2,2",),
    "test_zero.py::test_bfloat16_compute_gathers_what_zero0_uses": (),
    "test_zero.py::test_checkpoints_move_between_zero_values": (),
    "test_zero.py::test_zero2_reduces_every_microbatch_and_gathers_once": (),
    "test_zero.py::test_zero2_unrolled_gathers_each_layer_on_its_own": (),
    "test_zero.py::test_zero_parity": (
        "gpt-8x1x1-zero1-after",
        "gpt-2x2x2-zero2-1f1b",
        "llama-8x1x1-zero3",
        "gpt-4x1x2-zero3-selective",
    ),
    "test_zero_bubble.py::test_zb_h1_memory_is_bounded_in_m": (),
    "test_zero_bubble_v.py::test_zb_v_two_permutes_per_tick_and_memory_bounded_in_m": (),
    "test_zero_ring.py::test_parity": ("llama-8x1x1-zero3",),
    "test_zero_ring.py::test_parity_bfloat16_reduction": (),
    "test_zero_tensor.py::test_zero_adds_no_collective_over_tensor": (),
}


def pytest_collection_modifyitems(config, items):
    """Marks the SLOW tests. Where whole files were collected, a key or case of SLOW that
    names none of their tests is an error: a renamed test cannot leave the list unnoticed."""
    seen = {}
    for item in items:
        key = f"{item.path.name}::{item.originalname}"
        case = item.callspec.id if hasattr(item, "callspec") else None
        seen.setdefault(key, set()).add(case)
        if key in SLOW and case not in SLOW[key]:
            item.add_marker(pytest.mark.slow)
    if any("::" in arg for arg in config.args):
        return
    files = {key.split("::")[0] for key in seen}
    stale = [f"{key}[{case}]" if case else key
             for key, cases in SLOW.items() if key.split("::")[0] in files
             for case in cases or (None,) if key not in seen or case not in seen[key] | {None}]
    if stale:
        raise pytest.UsageError(f"tests/conftest.py: SLOW names no test here: {stale}")
