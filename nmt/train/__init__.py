"""`nmt train`, Section 5: the loop (policy over an engine), its settings, the resume rule, the label-smoothed loss, the schedule, precision, distributed data parallelism and the logs."""
