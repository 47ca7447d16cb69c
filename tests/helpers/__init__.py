"""What several test files share, one module per kind; `import helpers` reaches it all.

    processes.py   running the programs: to the end (`run`) or watched line by line
                   (`Task`); whole logs for a failure's message; /proc's view of them
    lines.py       the lines the programs print: their patterns, and readers
    files.py       what the programs write: checkpoints, event files, the data sets
    clusters.py    dist_train.py's quick flags and --local_cluster launcher; TF_CONFIG
    hostile.py     HTTP servers on 127.0.0.1, hostile files, a call that must return
    in_process.py  the trainer in this process: its settings, flags, graph, one step
    manifests.py   deploy/kubernetes's manifests (PyYAML), and each pod's environment

The pytest fixtures that use them are in tests/conftest.py.
"""
from helpers.processes import (ROOT, RUN_TIMEOUT_SECS, STARTS, TESTS_ONLY_ENV, WAIT_SECS,
                               Run, Task, start, once_per_run, pid_file_alive,
                               process_state, run, run_eval_once, send_and_mark,
                               server_import_secs, signal_caught, signal_pending, sleeping_in,
                               split_at_mark, started_tasks, task_pid, tasks_of, trainer_argv,
                               user_env, wait_until, write_log)
from helpers.lines import (DONE_LINE, LOSS_LINE, PRECISION_LINE, RESUMING_LINE, SAVED_LINE,
                           SKIP_LINE, STOPPED_LINE, TASK_PREFIX, TRAINING_FROM,
                           WORKER_LOSS_LINE, assert_each_refused_in_one_line,
                           assert_each_training_evaluated_into_its_own_eval_dir, by_task,
                           examples_per_sec, listed_flags, matches, sample_commands, steps)
from helpers.files import (Sample, checkpoint, cifar10_test_records, copy_checkpoint,
                           event_files, global_step, modes, scalar_steps_per_file, scalars,
                           scalars_per_file, summary_tags, tree, umask, write_sample,
                           write_start_checkpoint, other_checkout)
from helpers.clusters import (PREEMPT_STEPS, QUICK_FLAGS, STEADY_FLAGS,
                              assert_done_at_max_steps, chief_stopped_at_its_first_step,
                              fake_nvidia_smi, job_commands, local_cluster_task,
                              preempt_cluster, run_job, run_local_cluster, run_on_ps,
                              step_at_least,
                              sync_ps_state, tf_config)
from helpers.hostile import (HOSTILE_FILES, drip, make_hostile, returns_within, serve,
                             serve_stream, unblock_fifo)
from helpers.in_process import (bfloat16_units, input_main, one_train_step,
                                synthetic_settings, trainer_flags, trainer_settings)
