"""The fast tier (``make test-fast``): which tests carry the ``fast`` marker, in one place.

Budget: under 60 s wall on a loaded 2-core machine, and every module of
edgecap/, edgecap/service/ and compile/ exercised on its main path (see
docs/testing.md for the map and how it was measured). Files written for the
tier mark themselves (``pytestmark = pytest.mark.fast``); for the rest the
choice is listed here, chosen from measured durations, so that it is one
reviewable list and not a decorator scattered over sixty files.

``FAST_FILES``: every test of the file. ``FAST_TESTS``: by file, the test
functions (names without parameters; every parameter set of a listed function
is in). conftest.py applies both, and refuses a name that matches no test of
a file collected whole, so a renamed test cannot drop out of the tier
unnoticed (a run by node id, ``tests/test_x.py::test_y``, collects part of a
file and is not refused).
"""

from __future__ import annotations

from typing import Dict, FrozenSet, List

FAST_FILES: FrozenSet[str] = frozenset({
    # Whole files that cost about a second or less in all.
    "test_bad_bundle.py", "test_bad_frames.py", "test_bad_models.py", "test_bad_outputs.py",
    "test_bench_headline.py", "test_bundle.py", "test_bundle_branches.py", "test_camera_latest.py",
    "test_captioner.py", "test_compile_benchmark.py", "test_compile_cost_model.py",
    "test_compile_graph.py", "test_compile_rnn_charge.py",
    "test_compile_validity.py", "test_devices.py", "test_http.py", "test_latency_stats.py",
    "test_http_events.py", "test_metrics.py", "test_notify.py", "test_plan.py", "test_preprocess.py", "test_scheduler.py",
    "test_service_config.py", "test_service_devices.py", "test_service_state.py", "test_sinks.py",
    "test_sources.py", "test_startup.py", "test_tflite_verify.py", "test_windows.py", "test_imports.py",
})

FAST_TESTS: Dict[str, List[str]] = {
    # Replay after a failover: the resume point and one failover mid-window; the sweep
    # over every frame of a window (8 runs, 3 s) is in the full suite.
    "test_replay.py": ["test_the_resume_point_is_the_earliest_window_not_yet_captioned",
                       "test_overlapping_windows_survive_a_failover_too"],
    # The partitioner but its brute forces over every order and cut (4 s) and over
    # the benchmark boards (18 cases, 7 s): random small cases stay here.
    "test_compile_partitioner.py": [
        "test_dynamic_program_equals_brute_force_on_random_costs",
        "test_latency_breaks_bottleneck_ties_even_when_the_prefix_is_worse",
        "test_optimal_on_real_cost_model_for_any_number_of_tpus", "test_a_slow_cpu_gets_an_empty_stage",
        "test_equal_param_split_balances_parameter_bytes", "test_unneeded_stages_are_the_last_ones",
        "test_orders_skip_swaps_of_identical_tpus_only", "test_a_faster_tpu_later_in_the_profile_runs_first",
        "test_baselines_take_their_best_tpu_order",
        "test_balanced_split_keeps_every_op_on_the_tpus_and_balances_them",
        "test_an_unneeded_tpu_is_left_empty_at_the_end_of_the_chain",
        "test_a_busy_bus_is_the_bottleneck_and_moves_the_cut"],
    # Which candidates the compiler chooses, against the partitioner (about a second).
    "test_compile_candidates.py": ["test_every_scenario_is_served_within_the_gain_that_ends_the_list"],
    # All but the exhaustive search (4 s) and the beam benchmark's run (4 s).
    "test_beam.py": ["test_a_beam_of_one_is_the_greedy_decoder_token_for_token",
                     "test_length_normalisation_decides_between_lengths",
                     "test_top_k_is_best_first_and_breaks_ties_by_the_lower_index",
                     "test_captions_carry_the_decoders_confidence_at_the_chosen_width",
                     "test_an_out_of_range_beam_is_refused_in_one_line",
                     "test_the_json_lines_of_caption_carry_the_confidence_and_the_beam_flag_reaches_it",
                     "test_the_service_configs_beam_is_typed_with_a_one_line_error",
                     "test_the_service_config_takes_a_beam_and_defaults_to_the_runtimes"],
    # All but the libedgetpu fallback (2.7 s: it starts a probe child).
    "test_recognition.py": ["test_each_profile_is_recognised_from_its_own_rules"],
    "test_planner.py": ["test_the_board_is_recognised_from_its_device_tree",
                        "test_the_plan_for_the_board_is_taken_when_its_tpus_are_there",
                        "test_fewer_tpus_than_planned_falls_back_to_the_best_plan_for_what_is_there",
                        "test_no_tpu_runs_the_cpu_plan_or_fails_when_asked",
                        "test_uncompiled_and_foreign_plans_are_skipped_with_a_reason",
                        "test_a_bundle_without_plans_on_a_host_runs_on_the_cpu_quietly",
                        "test_auto_on_this_host_warns_once_and_captions_on_the_cpu",
                        "test_a_bundled_plan_made_for_another_window_is_skipped_with_one_warning",
                        "test_after_a_failure_only_plans_for_the_running_window_are_candidates",
                        "test_one_deadline_policy_for_every_tpu_stage",
                        "test_the_captioners_stages_carry_the_planners_deadlines_and_isolation",
                        "test_a_pending_crash_fault_isolates_that_device_only",
                        "test_the_host_rule",
                        "test_a_cpu_only_captioner_runs_the_host_rule_unless_told_otherwise",
                        "test_the_board_filter_keeps_each_boards_plans_whatever_their_order",
                        "test_among_plans_with_as_many_tpus_the_fastest_bottleneck_wins",
                        "test_a_plan_with_more_tpu_stages_than_attached_tpus_is_emulated",
                        "test_after_a_failure_the_compiler_replans_for_the_tpus_left",
                        "test_the_host_rules_reason_gives_both_schedules_times",
                        "test_a_plan_must_be_the_bundles_encoders"],
    "test_bad_input_cli.py": ["test_compile_out_folder_in_a_bad_place"],
    # The truth's grammar, one paced slowdown, the bus, the oracle (about a second in all).
    "test_emulation.py": ["test_the_issues_example_parses_device_by_device",
                          "test_a_malformed_truth_is_one_line_naming_the_part_and_the_grammar",
                          "test_a_stage_slowed_to_half_speed_takes_twice_as_long",
                          "test_two_stages_on_one_bus_together_move_no_more_than_its_rate"],
    "test_truth_bench.py": ["test_the_oracle_moves_work_off_a_slowed_tpu", "test_fps_timeline_and_seconds_to_95"],
    # Closed-loop planning's arithmetic and file, no pipeline (milliseconds each).
    "test_adapt.py": ["test_the_running_median_ignores_outliers_and_follows_a_step",
                      "test_one_observation_splits_the_error_in_proportion_to_the_parts",
                      "test_two_differently_made_stages_separate_compute_from_link",
                      "test_the_policy_is_read_from_its_data_file_with_its_reasons",
                      "test_corrections_are_kept_per_board_and_device",
                      "test_a_corrections_file_of_version_1_reads_as_the_speeds_it_meant",
                      "test_a_corrupt_corrections_file_is_one_warning_and_ignored"],
    # The history's main paths in well under a second each (no CLI children, no kill -9 trials).
    "test_history.py": ["test_events_are_written_once_per_batch_and_found_newest_first",
                        "test_the_query_is_quoted_words_of_the_text_column",
                        "test_camera_and_time_filters",
                        "test_the_disk_budget_deletes_the_oldest_first_and_shrinks_the_file",
                        "test_a_corrupt_file_is_moved_aside_with_one_warning_and_a_new_history_starts",
                        "test_an_event_left_open_by_a_crash_is_closed_at_the_next_start",
                        "test_bad_history_keys_are_one_line_errors_naming_the_key"],
    "test_bad_media.py": ["test_a_clip_damaged_in_the_middle_says_where_it_stopped",
                          "test_an_intact_clip_ends_without_an_error"],
    # Videos as they come: timestamps, a cut-off file, indices OpenCV must not see.
    "test_video_sources.py": ["test_a_variable_rate_clip_is_timed_by_each_frames_own_timestamp",
                              "test_a_cut_off_avi_gives_its_frames_then_one_line",
                              "test_camera_indices_opencv_must_not_see_are_refused_first"],
    "test_bad_plan.py": ["test_a_tpu_index_the_board_lacks", "test_a_segment_symlinked_out_of_the_directory"],
    "test_bench_rows.py": ["test_out_of_range_host_rounds_are_a_one_line_error"],
    "test_bench.py": ["test_null_stage_overhead_is_measured", "test_bound_charges_the_rnn_step_once_per_open_window",
                      "test_board_name_plans_on_the_fly_with_emulated_tpus", "test_unknown_board_is_a_one_line_error"],
    "test_cameras.py": ["test_stop_from_another_thread_ends_the_iteration_promptly",
                        "test_the_mux_beats_while_no_camera_has_a_frame",
                        "test_a_camera_that_never_sends_a_frame_is_offline_after_stall_seconds",
                        "test_a_failing_callback_does_not_stop_the_camera"],
    "test_cli.py": ["test_help_lists_every_command", "test_validate", "test_bad_bundle", "test_unknown_board",
                    "test_not_a_video"],
    "test_compile_calibration.py": ["test_tpu_segments_are_timed_on_the_named_tpu_with_the_repeats",
                                    "test_calibration_for_another_board_is_refused"],
    "test_compile_cli.py": ["test_bad_input_is_one_line"],
    "test_compile_edgetpu.py": ["test_without_the_compiler_segments_stay_uncompiled",
                                "test_compiles_each_tpu_segment_and_records_the_log"],
    "test_compile_planning.py": ["test_fixed_ranges_replace_the_search", "test_whole_on_tpu_plan_is_the_compilers_plan",
                                 "test_ranges_that_do_not_split_the_model_are_one_line"],
    "test_compile_segments.py": ["test_segments_keep_names_and_only_what_they_reference",
                                 "test_demo_encoder_chains_bit_identically"],
    "test_dataset.py": ["test_write_then_read_round_trips", "test_captions_follow_the_template_and_circles_never_rotate",
                        "test_read_dataset_rejects_missing_files"],
    "test_edgetpu_runtime.py": ["test_the_table_is_valid_and_every_row_has_a_source",
                                "test_the_backend_for_tpu_stages_follows_the_table",
                                "test_builds_are_told_apart_by_their_package_version",
                                "test_a_missing_library_gives_one_line"],
    "test_failover.py": ["test_the_sequential_schedule_fails_over_too",
                         "test_a_fault_fires_once_at_its_invoke_and_the_device_answers_after_its_delay",
                         "test_the_watchdog_fails_a_run_whose_step_outlives_its_deadline",
                         "test_with_failover_off_the_error_reaches_the_caller",
                         "test_the_tpus_left_are_the_boards_not_only_the_plans",
                         "test_a_fault_on_the_cpu_is_refused_in_one_line",
                         "test_the_caption_command_refuses_a_fault_for_a_tpu_the_board_lacks",
                         "test_the_reprobe_policy_is_read_from_its_data_file_with_its_reasons"],
    "test_fuzz_loaders.py": ["test_the_unmutated_documents_load", "test_what_the_long_run_found_stays_fixed"],
    "test_isolation.py": ["test_isolated_stages_equal_in_process_ones_bit_for_bit",
                          "test_a_stage_in_a_worker_checks_its_deadline"],
    "test_pipeline_captions.py": ["test_tpu_stages_run_on_their_own_emulated_devices",
                                  "test_device_override_runs_tpu_stages_on_cpu_workers",
                                  "test_timing_only_emulation_still_yields_every_window",
                                  "test_plan_for_another_model_is_rejected"],
    # The broker-free checks of topics and Home Assistant's discovery configs (milliseconds).
    "test_mqtt.py": ["test_camera_names_become_valid_topic_levels_and_home_assistant_ids"],
    "test_quality.py": ["test_eval_report"],
    "test_rnn_int8.py": ["test_the_shipped_int8_steps_hold_int8_weights_where_the_float_steps_hold_float"],
    "test_soak.py": ["test_the_command_refuses_a_soak_shorter_than_its_warm_up",
                     "test_a_fault_whose_device_the_plan_left_before_it_fired_moves_to_the_running_tpu"],
    "test_stopping.py": ["test_cancel_stops_the_run_and_keeps_the_workers_for_the_next",
                         "test_close_from_another_thread_while_the_consumer_holds_an_item",
                         "test_errors_come_after_the_items_before_them_even_from_the_first_worker",
                         "test_a_captioner_is_stopped_from_another_thread_and_refuses_a_second_stream",
                         "test_bad_options_are_config_errors"],
    "test_trace.py": ["test_slices_from_many_threads_are_all_kept_under_the_budget"],
    "test_window_state.py": ["test_back_to_back_windows_caption_their_own_clip",
                             "test_a_second_stream_starts_from_no_open_window"],
    # Compiled encoders and Coral's imported pipelines, in process (well under a second in all).
    "test_compiled_encoder.py": ["test_a_compiled_only_bundle_loads_where_it_was_refused_as_corrupt",
                                 "test_with_a_tpu_the_compiled_encoder_runs_on_it_and_without_one_the_cpu_twin",
                                 "test_a_compiled_only_bundle_on_a_cpu_only_host_is_refused_in_one_line"],
    "test_coral_pipeline.py": ["test_a_three_segment_pipeline_becomes_a_plan_with_the_skipping_tensor_forwarded",
                               "test_an_imported_plan_runs_emulated_timing_only_and_says_so_otherwise"],
    # The child's first invoke refusing a real crash (1.4 s: it starts the checker process).
    "test_trial_invoke.py": ["test_a_model_that_crashes_the_interpreter_is_refused_in_one_line"],
    "test_real_models.py": ["test_several_uint8_inputs_and_outputs_chain_bit_exact"],
}
