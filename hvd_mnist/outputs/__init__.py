"""What a run leaves and shows: checkpoints and the resume record, the per-epoch records
and summary, the exported model, TensorBoard events, progress, and timing; and the
lock by which one run at a time owns a model_dir (ownership.py).

Every write goes through files.py, so a failed write is one line naming the file.
"""
